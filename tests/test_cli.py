"""The `llasmol` console script (llasmol/cli.py): one name for every command, each the same as `python -m`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT
from llasmol.cli import COMMANDS, main

SCRIPT = Path(sys.executable).parent / "llasmol"
REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert SCRIPT.is_file(), f"no {SCRIPT}: install the package again (pip install -e .) to get the console script"
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=HANG_TIMEOUT)


def test_llasmol_help_lists_every_command_in_one_line(tmp_path):
    proc = _run(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.split("commands:\n")[1].split("\n\n")[0].splitlines()]
    assert listed == list(COMMANDS)
    assert "  train            LoRA fine-tuning on SMolInstruct." in proc.stdout
    assert "  evaluate         The paper's metrics for a predictions file or a trained model." in proc.stdout
    # Every command module of the package is listed, and each listed one is there.
    modules = {p.stem for p in (REPO / "llasmol").glob("*.py")} - {"__init__", "cli", "frame"}
    assert {m.split(".")[1] for m in COMMANDS.values()} == modules


def test_a_command_through_llasmol_is_the_python_m_command(tmp_path):
    """The same arguments, the same output: Hydra overrides and `--cfg job` (the composed config, no run)."""
    args = ["model=mistral", "lora=full", "--cfg", "job"]
    ours = _run(["train", *args], tmp_path)
    theirs = subprocess.run([sys.executable, "-m", "llasmol.train", *args], capture_output=True, text=True,
                            cwd=tmp_path, timeout=HANG_TIMEOUT)
    assert ours.returncode == theirs.returncode == 0, ours.stderr[-2000:]
    assert ours.stdout == theirs.stdout and "name: mistral" in ours.stdout
    params = _run(["params", "model=tiny", "lora=lite"], tmp_path)
    assert params.returncode == 0 and json.loads(params.stdout.splitlines()[-1])["trainable"] > 0
    mistake = _run(["train", "trainer.max_stepz=3"], tmp_path)  # the command's own refusals, as they are
    assert mistake.returncode == 2 and mistake.stderr.startswith("error: ") and "max_stepz" in mistake.stderr


@pytest.mark.parametrize("args,said", [(["trian"], "did you mean train?"), (["nothing"], "the commands are train,")])
def test_an_unknown_command_is_one_line_with_the_nearest_name(capsys, args, said):
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert err[0].startswith(f"error: llasmol has no command {args[0]!r}: ") and said in err[0]


def test_no_command_prints_the_list_and_fails_and_underscores_are_dashes(capsys, monkeypatch):
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 2 and "commands:" in capsys.readouterr().out
    ran = []
    monkeypatch.setattr(sys, "argv", ["llasmol", "convert_adapter", "x"])  # restored after the test
    monkeypatch.setattr("llasmol.cli.runpy.run_module", lambda module, **kw: ran.append((module, sys.argv[1:])))
    main(["convert_adapter", "x"])
    assert ran == [("llasmol.convert_adapter", ["x"])]
