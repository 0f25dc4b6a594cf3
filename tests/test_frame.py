"""Every Hydra command is a shell over one frame (llasmol/frame.py): the checks before Hydra, then inside it the
config check, the headline check and the CPU threads, in that order, whatever the command."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT

from llasmol.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
HYDRA_COMMANDS = [m for m in COMMANDS.values() if m not in ("llasmol.report", "llasmol.convert_adapter")]
FRAME_STEPS = {"quiet_known_noise", "use_cpu_threads", "check_headlines", "check_command_line", "hydra"}


@pytest.mark.parametrize("module", HYDRA_COMMANDS)
def test_each_hydra_command_takes_its_steps_from_the_frame_alone(module):
    """A step taken by hand in one command is the order drifting again (threads after torch, a check after a
    write): a command imports none of the frame's steps, and its entry is the frame's."""
    path = ROOT / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    imported = {a.name.split(".")[0] if isinstance(node, ast.Import) else a.name
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    assert not imported & FRAME_STEPS, f"{module} takes {sorted(imported & FRAME_STEPS)} by hand"
    entry = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    assert "main.from_command_line()" in ast.unparse(entry), module
    assert callable(__import__(module, fromlist=["main"]).main.from_command_line)


def test_a_bad_headline_stops_every_model_command_before_torch_loads(tmp_path):
    """The headline of a declared task is a setting: checked with the config, before the second torch takes to
    load (generate checked none before the frame)."""
    code = (
        "import sys\nfrom llasmol.core.config import compose_config\nfrom llasmol.core.errors import UserError\n"
        "from llasmol.evaluate import evaluate\nfrom llasmol.generate import generate\nfrom llasmol.export import export\n"
        "bad = '+data.new_tasks.t={family: boolean, headline: rmse}'\n"
        f"runs = [(evaluate, ['ckpt=none', 'model=tiny', bad, 'paths.output_dir={tmp_path}'], 'evaluate'),\n"
        "        (generate, ['model=tiny', 'query=hi', bad], 'generate'),\n"
        f"        (export, ['ckpt={tmp_path}', 'output={tmp_path / 'out'}', bad], 'export')]\n"
        "for fn, overrides, name in runs:\n"
        "    try:\n        fn(compose_config(overrides, name))\n"
        "    except UserError as err:\n        print(name, 'torch' in sys.modules, err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          timeout=HANG_TIMEOUT)
    lines = proc.stdout.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [["evaluate", "False"], ["generate", "False"],
                                                           ["export", "False"]], proc.stdout + proc.stderr[-2000:]
    assert all("data.new_tasks.t.headline=rmse is no score of the boolean family" in line for line in lines[:2])
    # export reads the run's own tasks.json: a declaration on its command line would never be applied
    assert "data is not a setting of the command line" in lines[2]


def test_the_command_line_is_checked_then_the_commands_own_check_then_hydra_runs(tmp_path):
    """In a process of its own: Hydra sets up logging to its run folder, which must not outlive the test."""
    code = ("import sys\nfrom omegaconf import OmegaConf\nfrom llasmol.frame import command\n"
            "@command('params', before=lambda argv: print('before', argv))\n"
            "def main(cfg):\n    print('body', cfg.lora.name)\n"
            "if sys.argv[1] == 'given':\n    main(OmegaConf.create({'lora': {'name': 'given'}}))\n"
            "else:\n    main.from_command_line()\n")
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"

    def run(*args):
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path,
                              timeout=HANG_TIMEOUT)

    ok = run("lora=lite", run_dir)
    assert ok.returncode == 0 and ok.stdout.splitlines() == [f"before ['lora=lite', '{run_dir}']", "body lite"], ok.stderr
    typo = run("lora=liet", run_dir)  # a mistyped choice: no check of its own, no body
    assert typo.returncode == 2 and typo.stdout == "" and "lora=liet" in typo.stderr
    given = run("given")  # a config given: the body on it, as Hydra's own main
    assert given.returncode == 0 and given.stdout.splitlines() == ["body given"], given.stderr


def test_the_hub_kernel_lines_bitsandbytes_says_at_every_model_commands_import_are_quieted(tmp_path):
    """peft imports bitsandbytes, whose CPU backend looks for a Hub kernel at import and, offline, says so in two
    warnings: importing llasmol (every command does, and a notebook) quiets exactly those lines; another warning
    of the same loggers still shows."""
    code = ("import logging, sys\nlogging.basicConfig(level=logging.INFO)\n"
            "if sys.argv[1] == 'quiet':\n    import llasmol\n"
            "import peft\nlogging.getLogger('bitsandbytes.backends.cpu.ops').warning('another line')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    said = {how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, env=env,
                                cwd=tmp_path, timeout=HANG_TIMEOUT).stderr for how in ("loud", "quiet")}
    if "kernels-community" not in said["loud"]:
        pytest.skip("this bitsandbytes says nothing of Hub kernels at import: nothing to quiet")
    assert "Skipping publisher trust check" in said["loud"]
    assert "kernels-community" not in said["quiet"] and "publisher trust" not in said["quiet"]
    assert "another line" in said["quiet"]


@pytest.mark.parametrize("module", ["llasmol.generate", "llasmol.export", "llasmol.params"])
def test_a_command_of_one_answer_refuses_a_sweep_in_one_line(module, tmp_path):
    from refusals import error_line, run_cli

    args = {"llasmol.generate": ["hi"], "llasmol.export": [f"ckpt={tmp_path}", f"output={tmp_path / 'o'}"],
            "llasmol.params": []}[module]
    proc = run_cli([module, *args, "--multirun"], tmp_path)
    assert proc.returncode == 2 and "runs once: --multirun sweeps train, evaluate and baseline" in error_line(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no multirun folder
