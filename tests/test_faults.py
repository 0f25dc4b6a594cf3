"""Bad input ends with one line; interruptions lose nothing; nothing unsafe is run."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import HANG_TIMEOUT
from llasmol.data.smolinstruct import SMolInstructSplit
from llasmol.core.errors import UserError
from smolinstruct_fixture import write_smolinstruct

ROOT = Path(__file__).resolve().parents[1]
TASKS = "data.tasks=[name_conversion-s2f,property_prediction-esol]"
QUICK = ["trainer.max_steps=2", "val_every_n_steps=1", "logger=csv", "trainer.enable_progress_bar=false",
         "callbacks.generation_evaluator.samples_per_task=1", "generation.max_new_tokens_limit=4"]


def run_cli(args: list[str], cwd: Path, **kw):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=HANG_TIMEOUT, **kw)


def one_error_line(proc) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    return errors[0]


@pytest.fixture
def broken_root(tmp_path) -> Path:
    return write_smolinstruct(tmp_path / "data")


def corrupt_template(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    templates = json.loads(path.read_text())
    templates[1]["input"] = "formula please"
    path.write_text(json.dumps(templates))
    return "template 1 of name_conversion-s2f"


def corrupt_raw_line(root: Path, split: str = "dev") -> str:
    path = root / "raw" / split / "name_conversion-s2f.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = '{"input": "CCO", "output": '
    path.write_text("\n".join(lines) + "\n")
    return f"{path} line 3 is not valid JSON"


def corrupt_train_line(root: Path) -> str:
    # Found when the index is built, before the first step, not when a batch first reads the line.
    return corrupt_raw_line(root, "train")


def missing_task_file(root: Path) -> str:
    (root / "raw" / "train" / "property_prediction-esol.jsonl").unlink()
    return "missing raw data file"


def missing_template(root: Path) -> str:
    (root / "template" / "instruction_tuning" / "name_conversion-s2f.json").unlink()
    return "name_conversion-s2f.json"


def index_beyond_raw(root: Path) -> str:
    path = root / "sample" / "instruction_tuning" / "train" / "name_conversion-s2f.json"
    record = json.loads(path.read_text())
    record["samples"][0]["idx"] = 999
    path.write_text(json.dumps(record))
    return "sample index 999"


def missing_split(root: Path) -> str:
    import shutil

    shutil.rmtree(root / "sample" / "instruction_tuning" / "dev")
    return "split 'dev' not found"


def non_object_raw_line(root: Path) -> str:
    # Valid JSON, but not a record: found at start-up, not hours later when a batch reads it.
    path = root / "raw" / "train" / "name_conversion-s2f.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = '["CCO", "C2H6O"]'
    path.write_text("\n".join(lines) + "\n")
    return f"{path} line 2 is not a JSON object with input and output (it is list)"


def record_without_output(root: Path) -> str:
    path = root / "raw" / "train" / "name_conversion-s2f.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = '{"input": "CCO"}'
    path.write_text("\n".join(lines) + "\n")
    return f"{path} line 1 is not a JSON object with input and output (it is dict)"


def templates_not_a_list(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    path.write_text(json.dumps({"input": "<INPUT>", "output": "<OUTPUT>"}))
    return "template/instruction_tuning/name_conversion-s2f.json is not a list of"


def template_not_strings(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    templates = json.loads(path.read_text())
    templates[0]["input"] = ["<INPUT>"]
    path.write_text(json.dumps(templates))
    return "template/instruction_tuning/name_conversion-s2f.json is not a list of"


def core_tag_wrong_shape(root: Path) -> str:
    path = root / "core_tag" / "name_conversion-s2f.json"
    path.write_text(json.dumps({"input": "<SMILES>", "output": ["<MOLFORMULA>", "</MOLFORMULA>"]}))
    return "core_tag/name_conversion-s2f.json is not"


def deeply_nested_template(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return "is nested too deeply"


def latin1_template(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    path.write_bytes('[{"input": "caf\xe9 <INPUT>", "output": "<OUTPUT>"}]'.encode("latin-1"))
    return "is not UTF-8 text"


@pytest.mark.parametrize("corrupt", [non_object_raw_line, record_without_output, templates_not_a_list,
                                     template_not_strings, core_tag_wrong_shape, deeply_nested_template,
                                     latin1_template, corrupt_train_line, index_beyond_raw])
def test_data_of_the_wrong_shape_is_named_when_the_split_is_opened(broken_root, corrupt):
    needle = corrupt(broken_root)
    with pytest.raises(UserError) as err:
        SMolInstructSplit(broken_root, "train", ["name_conversion-s2f", "property_prediction-esol"])
    assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("corrupt", [corrupt_template, corrupt_raw_line, corrupt_train_line, index_beyond_raw,
                                     missing_split, missing_task_file, missing_template, non_object_raw_line])
@pytest.mark.slow
def test_bad_data_ends_with_one_line_naming_it(broken_root, tmp_path, corrupt):
    needle = corrupt(broken_root)
    proc = run_cli(["llasmol.train", f"data.path={broken_root}", TASKS, f"hydra.run.dir={tmp_path / 'run'}", *QUICK],
                   tmp_path)
    assert proc.returncode == 2
    assert needle in one_error_line(proc)
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before any training step


def test_a_user_error_inside_a_dataloader_worker_is_still_one_line(capsys):
    """Worker processes re-raise with the worker's traceback in the message; only the cause is shown."""
    from torch._utils import ExceptionWrapper

    from llasmol.core.errors import UserError, report_user_errors

    try:
        raise UserError("raw/train/x.jsonl line 3 is not valid JSON: fix the line")
    except UserError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 1")

    @report_user_errors
    def job():
        wrapped.reraise()

    with pytest.raises(SystemExit) as exit_info:
        job()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: raw/train/x.jsonl line 3 is not valid JSON: fix the line\n"


def test_malformed_lines_can_be_skipped_and_counted(broken_root):
    whole = len(SMolInstructSplit(broken_root, "dev", ["name_conversion-s2f"]))
    needle = corrupt_raw_line(broken_root)
    with pytest.raises(UserError, match=re.escape(needle)):
        SMolInstructSplit(broken_root, "dev", ["name_conversion-s2f"])  # at once, not when the line is read
    lenient = SMolInstructSplit(broken_root, "dev", ["name_conversion-s2f"], skip_bad_lines=True)
    assert len(lenient) == whole - 1 and lenient.skipped == {"name_conversion-s2f": 1}
    assert all(lenient[i]["raw_input"] for i in range(len(lenient)))


@pytest.mark.parametrize("args,expected", [
    (["model=mistrall"], "error: model=mistrall is not a choice of model: pick one of codellama, galactica, "
                         "gemma2, hf, llama2, llama2_13b, llama31, mistral, mistral_nemo, mistral_v03, olmo2, qwen25, qwen3, "
                         "tiny"),
    # Each value of a sweep is checked before the first job runs.
    (["--multirun", "lora=lite,fulll"], "error: lora=fulll is not a choice of lora: pick one of attn, ffn, full"),
    (["trainer.max_stepz=3"], "error: trainer.max_stepz is not a setting of llasmol.train: check the spelling"),
    (["max_steps"], "error: cannot read the argument 'max_steps': settings are key=value"),
])
def test_a_mistyped_choice_or_setting_is_one_line_before_anything_runs(tmp_path, args, expected):
    proc = run_cli(["llasmol.train", *args, f"hydra.run.dir={tmp_path / 'run'}",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert proc.returncode == 2 and one_error_line(proc).startswith(expected), proc.stderr[-1500:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()  # no job started


def test_good_command_lines_pass_the_check():
    from llasmol.core.config import check_overrides, overrides_of

    check_overrides("train", overrides_of(["--multirun", "lora=lite,attn,ffn,full", "model=tiny", "--cfg", "job",
                                           "hydra/launcher=submitit_local", "+extra.key='a b'", "--info", "config"]))
    check_overrides("evaluate", ["ckpt=/some/run", "data.split=test", "data.tasks=[forward_synthesis]"])
    check_overrides("generate", ["task=forward_synthesis", "ckpt=none"])
    check_overrides("audit", ["data=smolinstruct", "data.path=/data/SMolInstruct", "held_out=[test]", "workers=2"])
    # A sweep of dicts, lists or quoted text: each value is checked as the value it is, not as a string.
    check_overrides("train", ["data.max_samples_per_task={train:8},{train:16}", "data.tasks=[forward_synthesis],null",
                              "model.prompt_template='Q: {input}','{input}'"])
    with pytest.raises(UserError, match=r"^data.max_samples_per_task=\{'train': -1\} must give each split's"):
        check_overrides("train", ["data.max_samples_per_task={train:8},{train:-1}"])
    with pytest.raises(UserError, match=r"^unknown task 'forward_synthesiss' in data.tasks"):
        check_overrides("train", ["data.tasks=[forward_synthesis],[forward_synthesiss]"])
    assert overrides_of(["-cn", "train", "--info", "a=1", "-m", "b=2"]) == ["a=1", "b=2"]


@pytest.mark.slow
def test_wandb_artifacts_without_an_online_run_end_with_one_line(tmp_path):
    proc = run_cli(["llasmol.train", "logger.wandb.log_model=true", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2 and "logger.wandb.log_model=True" in line and "logger.wandb.offline=false" in line
    assert not (tmp_path / "run" / "wandb").exists()  # refused before a W&B run was started


@pytest.mark.slow
def test_tensorboard_without_its_package_ends_with_one_line(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
        pytest.skip("tensorboard is installed here")
    proc = run_cli(["llasmol.train", "logger=tensorboard", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2 and "pip install tensorboard" in one_error_line(proc)


def test_missing_checkpoint_path_is_named(tmp_path):
    proc = run_cli(["llasmol.evaluate", "ckpt=/nonexistent/run", f"hydra.run.dir={tmp_path / 'h'}"], tmp_path)
    assert proc.returncode == 2 and "ckpt=/nonexistent/run holds no adapter" in one_error_line(proc)


@pytest.mark.slow
def test_non_finite_loss_stops_training_with_one_line(tmp_path):
    proc = run_cli(["llasmol.train", "optimizer.lr=1e30", f"hydra.run.dir={tmp_path / 'run'}", *QUICK,
                    "trainer.max_steps=30", "val_every_n_steps=1"], tmp_path)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "training loss became" in line and "optimizer.lr" in line
    # The checkpoints written before are whole: each loads and has its adapter.
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    assert ckpts, "validation every step: the steps before the blow-up left checkpoints"
    for ckpt in ckpts:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        assert state["state_dict"] and all(torch.isfinite(t).all() for t in state["state_dict"].values())
        assert (ckpt.with_name(ckpt.stem + ".adapter") / "adapter_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 1), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_saves_a_checkpoint_that_resumes(tmp_path, cfg_factory, sig, code):
    """Ctrl-C, or SIGTERM as a cluster sends before it preempts a job: a resumable checkpoint and a
    failing exit status (Lightning's own SIGTERM exit is 0, which a scheduler reads as done). Stopped in the
    first job of a multirun, the command also says how to run the jobs that had not started (#28 item 8)."""
    sweep = tmp_path / "sweep"
    run = sweep / "0_tiny_full"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llasmol.train", "--multirun", "lora=full,lite,attn", f"hydra.sweep.dir={sweep}",
         "trainer.max_steps=100000", "val_every_n_steps=1000", "logger=csv", "trainer.enable_progress_bar=false",
         "trainer.log_every_n_steps=1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    metrics = run / "csv" / "metrics.csv"
    deadline = time.time() + HANG_TIMEOUT
    while time.time() < deadline and (not metrics.is_file() or len(metrics.read_text().splitlines()) < 4):
        time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_TIMEOUT)
    assert proc.returncode == code, err[-2000:]
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file(), err[-2000:]
    given = "trainer.max_steps=100000 val_every_n_steps=1000 logger=csv trainer.enable_progress_bar=false " \
            "trainer.log_every_n_steps=1"
    assert err.rstrip().splitlines()[-3:] == [  # the jobs' own lines go to their train.log only
        "multirun stopped in job 0",
        f"  continue it with: python -m llasmol.train lora=full {given} hydra.run.dir={run} ckpt_path=last",
        "  the jobs that had not started run into the same folder with: python -m llasmol.train --multirun "
        f"lora=lite,attn {given} hydra.sweep.dir={sweep.resolve()} first_job=1"], err[-2000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_tiny_full"]  # nothing else started
    assert (run / "checkpoints" / "interrupted.adapter" / "adapter_model.safetensors").is_file()
    step = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert step >= 1
    from llasmol.train import train

    resumed = train(cfg_factory(f"ckpt_path={ckpt}", f"trainer.max_steps={step + 2}", "val_every_n_steps=1000",
                                "trainer.enable_progress_bar=false"))
    assert resumed["global_step"] == step + 2


WRITER = """
import sys, time
from llasmol.core.files import write_jsonl
def records():
    for i in range(10**6):
        if i == 50:
            print("writing", flush=True)
        time.sleep(0.001)
        yield {"i": i, "text": "x" * 100}
write_jsonl(sys.argv[1], records())
"""


def test_a_kill_while_writing_predictions_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "predictions" / "val.jsonl"
    target.parent.mkdir()
    target.write_text('{"old": true}\n')
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(0.2)
    proc.kill()
    proc.wait()
    assert target.read_text() == '{"old": true}\n'
    # The partial data only ever lived in a hidden temporary file, never under the real name.
    assert [p.name for p in target.parent.iterdir() if not p.name.startswith(".")] == ["val.jsonl"]


def test_the_package_never_evaluates_text():
    pattern = re.compile(r"(?<![\w.])(eval|exec)\s*\(")
    offenders = [f"{p}:{n}" for p in (ROOT / "llasmol").rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_remote_code_is_off_and_weights_load_from_safetensors():
    from conftest import compose_config

    for model in ("mistral", "llama2", "llama2_13b", "codellama", "galactica", "tiny"):
        assert compose_config([f"model={model}", "paths.output_dir=/x"]).model.trust_remote_code is False
    source = (ROOT / "llasmol" / "model" / "base.py").read_text()
    assert "use_safetensors=True" in source


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_a_paged_optimizer_without_cuda_ends_with_one_line(tmp_path):
    """Quantised bases run on a CPU (bitsandbytes' CPU backend); only paging optimizer state needs CUDA."""
    proc = run_cli(["llasmol.train", "quantization=4bit", "optimizer._target_=bitsandbytes.optim.PagedAdamW8bit",
                    f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "PagedAdamW8bit pages its state through CUDA memory" in line
    assert "optimizer._target_=bitsandbytes.optim.AdamW8bit" in line


def test_checkpoints_are_written_through_a_rename_in_their_own_folder(tmp_path, monkeypatch):
    from llasmol.finetune.checkpointing import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    target = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(2)}, target)
    before = target.read_bytes()

    def dies_halfway(obj, fh):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"w": torch.zeros(2)}, target)
    assert target.read_bytes() == before  # the old checkpoint, whole
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_training_checkpoints_go_through_the_atomic_writer(cfg_factory, monkeypatch, caplog):
    from llasmol.finetune.checkpointing import AtomicCheckpointIO
    from llasmol.train import train

    caplog.set_level(logging.INFO)
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)  # an earlier run in this process set it: this one must
    written = []
    original = AtomicCheckpointIO.save_checkpoint
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint",
                        lambda self, ckpt, path, storage_options=None: (written.append(Path(path).name),
                                                                         original(self, ckpt, path))[1])
    result = train(cfg_factory("trainer.max_steps=3", "val_every_n_steps=3", "trainer.enable_progress_bar=false",
                               "checkpoint_every_n_steps=2",
                               "callbacks.generation_evaluator.samples_per_task=1", "generation.max_new_tokens_limit=2",
                               "data.max_samples_per_task={validation:2}"))
    # last.ckpt every checkpoint_every_n_steps (2) and at the last step (3), the best checkpoint once (its validation).
    assert written.count("last.ckpt") == 2 and len([name for name in written if name.startswith("step")]) == 1, written
    # What train.log says of the run's shape: the threads and how they wait, the batch arithmetic.
    said = [r.getMessage() for r in caplog.records]
    # Seeded as the config says, dataloader workers included, without Lightning's own "Seed set to" line.
    assert os.environ.get("PL_SEED_WORKERS") == "1" and not any(m.startswith("Seed set to") for m in said), said
    assert any(m.startswith("CPU: ") and "intra-op thread(s), OpenMP threads wait passive" in m for m in said), said
    assert any(m.startswith("effective batch ") and m.endswith("× 1 process(es)") for m in said), said
    # The run ended by max_steps in its first epoch: last.ckpt is saved at the end of that step, with the
    # epoch still open, so a resume to a higher max_steps trains on through the rest of the epoch's data (saved
    # once Lightning has ended fit, it would count the epoch as done and skip the rest).
    ckpt = torch.load(Path(result["output_dir"]) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    assert ckpt["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0
    # Each adapter's model card says how it was made; a validation's numbers only on the checkpoint saved after
    # that validation (the best one), not on last.adapter, saved at the step's end before it.
    checkpoints = Path(result["output_dir"]) / "checkpoints"
    last_card = (checkpoints / "last.adapter" / "README.md").read_text()
    assert "# tiny + LoRA `full` on SMolInstruct" in last_card and "optimizer step 3" in last_card
    assert "- recipe: AdamW lr 0.003, cosine schedule" in last_card  # the demo recipe's optimizer, by its class name
    assert "Validation at this step" not in last_card
    best_card = (next(checkpoints.glob("step3-*.adapter")) / "README.md").read_text()
    assert "optimizer step 3" in best_card and "| val/loss |" in best_card


def test_an_adapter_save_stopped_between_its_renames_leaves_the_previous_one_readable(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from llasmol.model.adapters import readable_adapter, save_adapter_atomically
    from llasmol.model.base import arch_config
    from llasmol.model.lora import apply_lora
    from conftest import compose_config

    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    model = apply_lora(AutoModelForCausalLM.from_config(arch_config(cfg.model.arch, vocab_size=64)), cfg.model, cfg.lora)
    target = tmp_path / "checkpoints" / "last.adapter"
    save_adapter_atomically(model, target)
    first = (target / "adapter_model.safetensors").read_bytes()

    real_rename = Path.rename

    def stop_before_the_new_one_is_in(self, dest):
        if self.name.startswith(".last.adapter.") and not self.name.endswith(".old"):
            raise KeyboardInterrupt  # the old adapter has stepped aside, the new one is not in place
        return real_rename(self, dest)

    monkeypatch.setattr(Path, "rename", stop_before_the_new_one_is_in)
    with pytest.raises(KeyboardInterrupt):
        save_adapter_atomically(model, target)
    monkeypatch.undo()
    assert not target.exists()
    found = readable_adapter(target)
    assert (found / "adapter_model.safetensors").read_bytes() == first  # the previous adapter, whole
    save_adapter_atomically(model, target)  # the next save puts things right
    assert readable_adapter(target) == target
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.adapter"]


def test_written_files_and_adapter_folders_respect_the_umask(tmp_path):
    """Atomic writes go through mkstemp/mkdtemp (0600/0700); under a 022 umask a plain open gives 0644."""
    import stat

    from llasmol.core.files import write_json
    from llasmol.model.adapters import save_adapter_atomically

    class Saver:
        def save_pretrained(self, folder, state_dict=None, **kwargs):
            (Path(folder) / "adapter_config.json").write_text("{}")

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "m.json", {"a": 1})
        save_adapter_atomically(Saver(), tmp_path / "x.adapter")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "x.adapter").stat().st_mode) == 0o755


@pytest.mark.slow
def test_a_command_stopped_by_a_mistake_leaves_no_empty_run_folder(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    for args in (["llasmol.train", "data.micro_batch_size=3", "logger=csv"],
                 ["llasmol.evaluate", f"predictions={tmp_path / 'nope.jsonl'}"]):
        proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=HANG_TIMEOUT)
        assert proc.returncode == 2 and proc.stderr.count("error:") == 1, proc.stderr[-1500:]
    leftovers = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()] if (tmp_path / "outputs").exists() else []
    assert leftovers == []
    proc = subprocess.run([sys.executable, "-m", "llasmol.train", "data.micro_batch_size=3", "logger=csv"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG_TIMEOUT)
    assert "set data.effective_batch_size=6 (or another multiple of 3)" in proc.stderr


HOLDER = """
import sys, time
from llasmol.core.run_lock import hold_run_lock
hold_run_lock(sys.argv[1])
print("holding", flush=True)
time.sleep(600)
"""


def test_a_run_directory_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    from llasmol.core.run_lock import check_run_lock, hold_run_lock

    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        for attempt in (hold_run_lock, check_run_lock):
            with pytest.raises(UserError, match=rf"{run} is in use by another llasmol.train \(pid {holder.pid} on "):
                attempt(run)
    finally:
        holder.kill()  # no chance to clean up: the kernel releases the lock
        holder.wait()
    check_run_lock(run)
    hold_run_lock(run)  # free again
    hold_run_lock(run)  # and taking it twice in one process is not a conflict


@pytest.mark.slow
def test_a_second_run_into_a_busy_directory_stops_before_touching_it(tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={run}", "logger=csv",
                              "trainer.max_steps=400", "trainer.enable_progress_bar=false", "seed=1"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.time() + HANG_TIMEOUT
        while time.time() < deadline and first.poll() is None and not (
                (run / ".lock").is_file() and (run / ".lock").read_text()):
            time.sleep(0.05)
        config = (run / ".hydra" / "overrides.yaml").read_text()
        second = run_cli(["llasmol.train", f"hydra.run.dir={run}", "logger=csv", "seed=2"], tmp_path)
        assert second.returncode == 2
        assert one_error_line(second).startswith(f"error: {run} is in use by another llasmol.train (pid {first.pid} ")
        assert (run / ".hydra" / "overrides.yaml").read_text() == config  # the first run's config, untouched
        assert "is in use" not in (run / "train.log").read_text()  # its Hydra never started there
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()


STALLING_TRAIN = """
import runpy, sys, time
import llasmol.core.files as files

real, saves = files._atomic_write, []


def atomic_write(path, write, binary=False):
    if path.name == "last.ckpt":
        saves.append(path)
        if len(saves) == 2:  # the second last.ckpt: stall half-way through, to be killed there
            def stalled(fh):
                fh.write(b"half a checkpoint")
                (path.parents[1] / "stalled").write_text("")
                time.sleep(600)
            return real(path, stalled, binary)
    return real(path, write, binary)


files._atomic_write = atomic_write
sys.argv = ["llasmol.train", *sys.argv[1:]]
runpy.run_module("llasmol.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_kill_during_a_checkpoint_write_keeps_adapter_and_checkpoint_of_one_step(tmp_path):
    """SIGKILL while last.ckpt is being written (no handler runs): last.adapter and last.ckpt stay a pair of
    one step, and the next start in the folder removes what the killed writes left."""
    from llasmol.model.adapters import adapter_step
    from llasmol.finetune.resume import checkpoint_step

    run = tmp_path / "run"
    args = [f"hydra.run.dir={run}", "logger=csv", "trainer.enable_progress_bar=false", "checkpoint_every_n_steps=2",
            "val_every_n_steps=1000", "trainer.max_steps=6"]
    proc = subprocess.Popen([sys.executable, "-c", STALLING_TRAIN, *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.time() + HANG_TIMEOUT
        while time.time() < deadline and proc.poll() is None and not (run / "stalled").exists():
            time.sleep(0.1)
        assert (run / "stalled").exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timeout"
    finally:
        proc.kill()
        proc.wait()
    checkpoints = run / "checkpoints"
    last, adapter = checkpoints / "last.ckpt", checkpoints / "last.adapter"
    assert checkpoint_step(str(last)) == adapter_step(adapter) == 2  # the step-4 pair was never half-installed
    left = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("."))
    assert [n for n in left if n.startswith(".last.ckpt.") and n.endswith(".tmp")], left  # the killed writes'
    assert [n for n in left if n.startswith(".last.adapter.")], left

    resumed = run_cli(["llasmol.train", *args, "ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r"removed 2 temporary file\(s\) left by writes a stop interrupted", (run / "train.log").read_text())
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]
    assert checkpoint_step(str(last)) == adapter_step(adapter) == 6


def _mounted_tmpfs(folder: Path, options: str) -> None:
    folder.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small file system here ({mount.stderr.decode().strip()[:80]})")


@pytest.mark.slow
def test_a_full_disk_ends_training_with_one_line_naming_the_file(tmp_path):
    small = tmp_path / "small"
    _mounted_tmpfs(small, "size=700k")  # room for the run's logs and an adapter, not for a checkpoint
    try:
        run = small / "run"
        proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", "logger=csv", "trainer.enable_progress_bar=false",
                        "trainer.max_steps=2", "val_every_n_steps=1000"], tmp_path)
        line = one_error_line(proc)
        assert proc.returncode == 2
        assert re.match(rf"error: cannot write {run}/checkpoints/last\.ckpt: no space left on device \(0\.00 GB free "
                        r"there\); free space there .* hydra\.run\.dir=", line), line
        assert line in (run / "train.log").read_text()  # the log says why the run ended
        assert not [p.name for p in (run / "checkpoints").iterdir()]  # no temporaries, no adapter without its .ckpt
    finally:
        subprocess.run(["umount", str(small)])


@pytest.mark.slow
def test_a_read_only_run_folder_is_one_line_before_hydra_writes(tmp_path):
    frozen = tmp_path / "frozen"
    _mounted_tmpfs(frozen, "size=100k,ro")
    try:
        for command in ("llasmol.train", "llasmol.evaluate", "llasmol.audit"):
            proc = run_cli([command, f"hydra.run.dir={frozen}/run"], tmp_path)
            assert one_error_line(proc) == (
                f"error: {frozen} is on a read-only file system, so the run folder {frozen}/run cannot be written "
                "there: give the run a writable folder with hydra.run.dir=<folder> (or run from a writable directory)")
            assert proc.returncode == 2
    finally:
        subprocess.run(["umount", str(frozen)])


def _fill(folder: Path) -> None:
    """Take every free byte of the file system `folder` is on."""
    with open(folder / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


@pytest.mark.slow
def test_every_command_meets_a_full_disk_with_one_line(tmp_path):
    """Hydra writes the run's config before any of our code runs: a full disk is refused before that, for
    every command with a run folder; report's files go through the atomic writer and name the file."""
    from test_analysis import write_run

    full = tmp_path / "full"
    _mounted_tmpfs(full, "size=300k")
    run = write_run(tmp_path / "run")
    try:
        _fill(full)
        for command in (["llasmol.train"], ["llasmol.evaluate", f"predictions={tmp_path}/none.jsonl"],
                        ["llasmol.baseline", "method=rdkit"], ["llasmol.audit"]):
            proc = run_cli([*command, f"hydra.run.dir={full}/run"], tmp_path)
            assert proc.returncode == 2
            assert one_error_line(proc) == (
                f"error: cannot write the run folder {full}/run: no space left on device (0.00 GB free there); free "
                "space there (old runs' checkpoints/) or write the run elsewhere with hydra.run.dir=...")
            assert not (full / "run").exists()
        proc = run_cli(["llasmol.report", str(run), "--out", str(full / "report")], tmp_path)
        assert proc.returncode == 2
        assert re.fullmatch(rf"error: cannot write {full}/report/\S+: no space left on device \(0\.00 GB free there\); "
                            r"free space there \(old runs' checkpoints/\) or write the report elsewhere with --out "
                            r"<folder>", one_error_line(proc)), proc.stderr[-800:]
        assert [p.name for p in (full / "report").iterdir()] == []  # no half-written file
    finally:
        subprocess.run(["umount", str(full)])


def test_report_out_naming_a_file_is_one_line(tmp_path, capsys):
    from test_analysis import write_run

    from llasmol.report import main as report_main

    run = write_run(tmp_path / "run")
    taken = tmp_path / "taken.md"
    taken.write_text("mine")
    with pytest.raises(SystemExit) as stop:
        report_main([str(run), "--out", str(taken)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out {taken} is not a folder: {taken} is a file; give the folder the report's files go into (it is "
        f"made if missing), e.g. --out {tmp_path / 'report'}")
    with pytest.raises(SystemExit) as stop:  # a folder under a file cannot be made either
        report_main([str(run), "--out", str(taken / "sub" / "report")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out {taken / 'sub' / 'report'} is not a folder: {taken} is a file; give the folder the report's "
        f"files go into (it is made if missing), e.g. --out {tmp_path / 'report'}")
    assert taken.read_text() == "mine"
    assert report_main([str(run), "--out", str(tmp_path / "again")])  # a fresh folder: written
    assert report_main([str(run), "--out", str(tmp_path / "again")])  # an existing report: overwritten cleanly


def test_temporaries_of_dead_writers_are_removed_and_those_of_live_ones_kept(tmp_path):
    from llasmol.core.files import remove_stale_temporaries, write_json

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(dead.stdout), os.getpid()
    (tmp_path / "checkpoints" / f".last.adapter.{dead_pid}.ab_c1234").mkdir(parents=True)
    (tmp_path / "checkpoints" / f".last.adapter.{dead_pid}.ab_c1234" / "adapter_model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "checkpoints" / f".last.ckpt.{dead_pid}.q1w2e3r4.tmp").write_bytes(b"y" * 5)
    (tmp_path / "predictions").mkdir()
    (tmp_path / "predictions" / f".val.jsonl.{live_pid}.q1w2e3r4.tmp").write_text("live")
    # A number no process can have (os.kill overflows) is not known dead: its file stays.
    kept = ["notes.txt", ".hidden", f".last.ckpt.{dead_pid}.tmp", "last.ckpt",
            ".last.ckpt.99999999999999999999.q1w2e3r4.tmp"]
    for name in kept:
        (tmp_path / "checkpoints" / name).write_text("mine")
    write_json(tmp_path / "metrics.json", {"a": 1})  # a finished write leaves no temporary

    removed, size = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [f".last.adapter.{dead_pid}.ab_c1234", f".last.ckpt.{dead_pid}.q1w2e3r4.tmp"]
    assert size == 15
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(kept)
    assert (tmp_path / "predictions" / f".val.jsonl.{live_pid}.q1w2e3r4.tmp").read_text() == "live"


def test_claiming_a_run_folder_locks_it_and_clears_what_a_killed_run_left(tmp_path, caplog):
    """What train does first (in-process): the folder is this process's alone, and a dead writer's temporary
    is gone with a line in the log."""
    from llasmol.finetune.preflight import claim_run_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "run" / "checkpoints" / f".last.ckpt.{int(dead.stdout)}.q1w2e3r4.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"y" * 5)
    with caplog.at_level("WARNING", logger="llasmol.train"):
        assert claim_run_dir(tmp_path / "run") == tmp_path / "run"
    assert not stale.exists() and "removed 1 temporary file(s)" in caplog.text
    other = subprocess.run([sys.executable, "-c", "import sys; from llasmol.core.run_lock import check_run_lock; "
                            "check_run_lock(sys.argv[1])", str(tmp_path / "run")], capture_output=True, text=True,
                           timeout=HANG_TIMEOUT)
    assert other.returncode != 0 and f"{tmp_path / 'run'} is in use by another llasmol.train (pid {os.getpid()}" \
        in other.stderr, other.stderr[-800:]


def test_a_full_disk_or_read_only_folder_is_a_user_error_naming_the_file(tmp_path, monkeypatch):
    import errno

    from llasmol.core.files import write_json

    for code, words in ((errno.ENOSPC, "no space left on device ("), (errno.EROFS, "read-only file system;"),
                        (errno.EDQUOT, "disk quota exceeded (")):
        def full(fd, code=code):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(UserError, match=re.escape(f"cannot write {tmp_path / 'm.json'}: {words}")):
            write_json(tmp_path / "m.json", {"a": 1})
        assert list(tmp_path.iterdir()) == []  # the temporary went with the error
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):  # a failing disk is not a user's mistake: it stays loud
        write_json(tmp_path / "m.json", {"a": 1})


def test_the_next_start_brings_back_a_stepped_aside_adapter_and_names_a_split_pair(tmp_path):
    from llasmol.core.files import write_torch
    from llasmol.finetune.checkpointing import tidy_run_dir

    checkpoints = tmp_path / "checkpoints"
    (checkpoints / ".last.adapter.old").mkdir(parents=True)  # stopped between the two renames of a save
    (checkpoints / ".last.adapter.old" / "adapter_config.json").write_text("{}")
    (checkpoints / ".last.adapter.old" / "trainer_state.json").write_text('{"global_step": 4}')
    write_torch(checkpoints / "last.ckpt", {"global_step": 4})
    (checkpoints / "best.adapter").mkdir()
    (checkpoints / "best.adapter" / "trainer_state.json").write_text('{"global_step": 9}')
    write_torch(checkpoints / "best.ckpt", {"global_step": 8})

    notes = tidy_run_dir(tmp_path)
    assert notes == ["restored last.adapter (its replacement was stopped between two renames)",
                     "best.adapter holds step 9 but best.ckpt step 8 (a stop between their final renames); "
                     "the next save under this name writes both again"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.adapter", "best.ckpt", "last.adapter", "last.ckpt"]
    assert tidy_run_dir(tmp_path) == [notes[1]]  # in order now, but for the pair that only a new save mends


def _finished_run(folder: Path) -> Path:
    """What a finished training leaves that a fresh start would replace (no training: the check reads names)."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"old")
    (folder / "result.json").write_text('{"global_step": 800}')
    return folder


def test_a_fresh_start_in_a_folder_holding_a_run_is_refused_unless_asked(tmp_path):
    from llasmol.core.config import command_line_values
    from llasmol.core.run_lock import check_fresh_start

    run = _finished_run(tmp_path / "run")
    with pytest.raises(UserError) as err:
        check_fresh_start(run, None, False)
    assert str(err.value) == (f"{run} already holds a run, and starting fresh there would replace its checkpoints, "
                              "result and config: continue it with ckpt_path=last, give this run a new folder "
                              "(another hydra.run.dir=...), or start over in it with overwrite=true")
    for ckpt_path, overwrite in (("last", False), ("auto", False), (None, True)):
        check_fresh_start(run, ckpt_path, overwrite)  # resuming, or said explicitly
    with pytest.raises(UserError, match="overwrite=true"):
        check_fresh_start(run, None, "maybe")  # only a real true says so
    check_fresh_start(tmp_path / "new", None, False)
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "train.log").write_text("error: a typo")  # a start that stopped before training
    check_fresh_start(tmp_path / "started", None, False)
    # A sweep's folder holding a finished job; a run killed before its first checkpoint cannot be resumed.
    sweep = tmp_path / "sweep"
    _finished_run(sweep / "1_tiny_attn")
    with pytest.raises(UserError, match=rf"^{sweep / '1_tiny_attn'} already holds a run"):
        check_fresh_start(sweep, None, False)
    with pytest.raises(UserError, match=rf"^{sweep / '1_tiny_attn'} already holds a run"):
        check_fresh_start(sweep, None, False, 1)
    check_fresh_start(sweep, None, False, 2)  # the jobs a stopped sweep had not started: numbered from 2 on
    # A folder in a sweep's folder not named as a job (`<number>_...`) counts as its first job.
    other = tmp_path / "other"
    _finished_run(other / "notes")
    with pytest.raises(UserError, match=rf"^{other / 'notes'} already holds a run"):
        check_fresh_start(other, None, False, 0)
    check_fresh_start(other, None, False, 1)
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "params.json").write_text("{}")
    with pytest.raises(UserError) as err:
        check_fresh_start(tmp_path / "early", None, False)
    assert "ckpt_path=last" not in str(err.value) and "overwrite=true" in str(err.value)
    defaults = {"ckpt_path": None, "overwrite": False}
    assert command_line_values(["hydra.run.dir=x", "ckpt_path=last"], defaults) == {"ckpt_path": "last",
                                                                                      "overwrite": False}
    assert command_line_values(["overwrite=true", "ckpt_path=null"], defaults) == {"ckpt_path": None,
                                                                                     "overwrite": True}


def test_a_multirun_into_a_sweep_folder_holding_its_first_job_is_refused_before_hydra_starts(tmp_path):
    """The check runs in the command's first lines (rank 0 only), with `first_job` 0 unless given: job 0's
    finished run is not replaced by a new sweep into its folder. (--cfg job: were the check passed, Hydra
    would print the config and exit 0, running nothing.)"""
    sweep = tmp_path / "sweep"
    _finished_run(sweep / "0_tiny_lite")
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    proc = run_cli(["llasmol.train", "--multirun", f"hydra.sweep.dir={sweep}", "lora=lite,attn", "--cfg", "job"],
                   tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert one_error_line(proc).startswith(f"error: {sweep / '0_tiny_lite'} already holds a run")
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
    # The jobs after it (first_job=1, as a stopped sweep's continue command says) pass the check.
    # (--cfg job cannot go with --multirun: the check reads the same line either way)
    proc = run_cli(["llasmol.train", f"hydra.sweep.dir={sweep}", "lora=attn", "first_job=1", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0 and "first_job: 1" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.slow
def test_train_into_a_finished_run_stops_before_hydra_writes_there(tmp_path):
    """The command line is refused before Hydra writes .hydra/ (or anything else) into the finished run."""
    run = _finished_run(tmp_path / "run")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", *QUICK], tmp_path)
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(f"error: {run} already holds a run") and "ckpt_path=last" in proc.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # Said explicitly, the command line passes the check (--cfg job: composed and printed, nothing run).
    proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", "overwrite=true", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0 and "overwrite: true" in proc.stdout, proc.stderr[-2000:]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_the_user_error_wrapper_passes_results_and_bugs_through_and_finds_a_wrapped_user_error(
        tmp_path, capsys, monkeypatch):
    import io
    import logging

    from llasmol.core.errors import UserError, _cause_line, _find_user_error, report_user_errors

    @report_user_errors
    def add(x, y=1):
        """Adds."""
        return x + y

    assert add(2, y=3) == 5 and add.__name__ == "add" and add.__doc__ == "Adds."

    @report_user_errors
    def bug():
        raise ValueError("a bug: its traceback is wanted")

    with pytest.raises(ValueError):
        bug()

    @report_user_errors
    def wrapped():  # as Hydra's instantiate wraps what a constructor raises
        try:
            raise UserError("lora.r=0 must be at least 1: set lora.r=8")
        except UserError as err:
            raise RuntimeError("Error in call to target") from err

    @report_user_errors
    def during():  # raised while handling it: found through __context__
        try:
            raise UserError("data.path=/x does not exist: point it at SMolInstruct")
        except UserError:
            raise KeyError("cleanup failed")

    # The run's log file gets the line too; the console has it once, on stderr.
    log_file, console = tmp_path / "train.log", io.StringIO()
    handlers = [logging.FileHandler(log_file), logging.StreamHandler(console)]
    root = logging.getLogger()
    for handler in handlers:
        root.addHandler(handler)
    try:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
        for fn, line in [(wrapped, "lora.r=0 must be at least 1: set lora.r=8"),
                         (during, "data.path=/x does not exist: point it at SMolInstruct")]:
            with pytest.raises(SystemExit) as stop:
                fn()
            assert stop.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"
        monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
        with pytest.raises(SystemExit):
            wrapped()
        monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the traceback, as Hydra keeps its own
        with pytest.raises(RuntimeError):
            wrapped()
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
    assert log_file.read_text().splitlines() == ["error: lora.r=0 must be at least 1: set lora.r=8",
                                                 "error: data.path=/x does not exist: point it at SMolInstruct",
                                                 "error: lora.r=0 must be at least 1: set lora.r=8"]
    assert console.getvalue() == ""
    # A worker's folded traceback without a UserError in its last line: that last line.
    assert _cause_line("Traceback (most recent call last):\n  File x\nValueError: bad\n") == "ValueError: bad"
    assert _cause_line("one line, no traceback") == "one line, no traceback"
    a, b = ValueError("a"), ValueError("b")  # a cycle of contexts ends the search
    a.__context__, b.__context__ = b, a
    assert _find_user_error(a) is None


def _as_hydra_run(folder, overrides=()):
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra = OmegaConf.structured(HydraConf)
    hydra.runtime.output_dir, hydra.job.name, hydra.overrides.hydra = str(folder), "train", list(overrides)
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))


@pytest.mark.parametrize("named", [False, True])
def test_a_mistake_removes_the_run_folder_only_when_it_holds_nothing_but_hydras_files(tmp_path, capsys, monkeypatch,
                                                                                       named):
    from hydra.core.hydra_config import HydraConfig

    from llasmol.core.errors import UserError, report_user_errors

    @report_user_errors
    def job():
        raise UserError("model=x is not a choice")

    empty, kept = tmp_path / "2026-12-02" / "07-00-00", tmp_path / "2026-12-02" / "07-00-01"
    for folder in (empty, kept):
        (folder / ".hydra").mkdir(parents=True)
        (folder / "train.log").write_text("")
        (folder / ".lock").write_text("")
    (kept / "predictions").mkdir()
    monkeypatch.chdir(tmp_path)
    # Hydra's log handler of the run folder, and another's: only the folder's is closed with it
    own, other = logging.FileHandler(empty / "train.log", delay=False), logging.FileHandler(tmp_path / "other.log")
    root = logging.getLogger()
    root.addHandler(own)
    root.addHandler(other)
    try:
        for folder in (empty, kept):
            _as_hydra_run(folder, [f"hydra.run.dir={folder}"] if named else [])
            with pytest.raises(SystemExit):
                job()
            for handler in (own, other):  # the command has ended: its handlers go with it
                root.removeHandler(handler)
        _as_hydra_run(tmp_path)  # generate runs in place: the working folder is never removed
        with pytest.raises(SystemExit):
            job()
    finally:
        HydraConfig.instance().cfg = None
        for handler in (own, other):
            root.removeHandler(handler)
    assert empty.exists() == named  # a folder the user named keeps its log
    assert kept.exists() and tmp_path.exists()
    assert (own.stream is None) == (not named) and other.stream is not None  # closed only with its folder
    other.close()
    own.close()


def _open_fds(path) -> int:
    """This process's open descriptors of `path` (others' threads may open and close files meanwhile)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed since it was listed
            pass
    return count


def test_a_lock_held_by_an_unnamed_holder_is_refused_in_one_line_without_leaking(tmp_path, monkeypatch):
    """flock locks belong to an open file, so a second open in this process conflicts like another process
    would. A lock file that does not say who holds it still gives the one-line refusal; the refusals close what
    they opened."""
    import fcntl

    from llasmol.core.run_lock import check_run_lock, hold_run_lock

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("not json")
    fd = os.open(run / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        before = _open_fds(run / ".lock")
        for attempt in (hold_run_lock, check_run_lock):
            with pytest.raises(UserError) as err:
                attempt(run)
            assert str(err.value) == (f"{run} is in use by another llasmol.train (another process): wait for it to "
                                      "end, or give this run its own hydra.run.dir")
        assert _open_fds(run / ".lock") == before == 1  # the test's own descriptor only
        # The holder named in the file, its start time in local time.
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
        (run / ".lock").write_text(json.dumps({"pid": 7, "host": "node3", "started": 86400 + 3661}))
        with pytest.raises(UserError, match=re.escape("(pid 7 on node3, started 1970-01-02 01:01:01): wait")):
            check_run_lock(run)
    finally:
        os.close(fd)
        monkeypatch.undo()  # TZ as it was, and the process's time zone read again
        time.tzset()
    check_run_lock(run)  # released: free again
    check_run_lock(None)  # nothing to check
    check_run_lock(tmp_path / "new")  # no lock file: nothing opened
    assert not (tmp_path / "new").exists()


def test_a_taken_lock_names_this_process_in_a_file_readable_by_all(tmp_path, monkeypatch):
    """A longer text left in the lock file by an earlier holder is replaced whole; the file is created
    rw-rw-rw- less the umask, like any file the package writes."""
    from llasmol.core import run_lock
    from llasmol.core.run_lock import hold_run_lock

    held = {}
    monkeypatch.setattr(run_lock, "_held", held)  # this test's locks, released at its end

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(json.dumps({"pid": 1, "host": "x" * 500, "started": 0}))
    hold_run_lock(run)
    info = json.loads((run / ".lock").read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert abs(info["started"] - time.time()) < 600
    fresh = tmp_path / "fresh" / "deeper"
    hold_run_lock(fresh)  # the folder is made
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh / ".lock").stat().st_mode & 0o777 == 0o666 & ~umask
    for fd in held.values():
        os.close(fd)


def test_a_fresh_start_counts_every_job_folder_by_default_or_for_a_sweep_of_first_jobs(tmp_path):
    from llasmol.core.run_lock import check_fresh_start

    sweep = tmp_path / "sweep"
    _finished_run(sweep / "0_tiny_attn")
    for args in ((), (0,), ("1,2",)):  # the default and a sweep over first_job (not one number) start from job 0
        with pytest.raises(UserError, match=rf"^{sweep / '0_tiny_attn'} already holds a run"):
            check_fresh_start(sweep, None, False, *args)
    check_fresh_start(sweep, None, False, 1)


def test_an_adapter_stepped_aside_is_dropped_when_its_place_is_taken_or_it_is_incomplete(tmp_path):
    """Only a whole adapter (its adapter_config.json there) whose place is empty comes back; any other
    `.X.adapter.old` is a leftover and goes, without a note."""
    from llasmol.finetune.checkpointing import tidy_run_dir

    checkpoints = tmp_path / "checkpoints"
    for name in ("last", "best"):
        (checkpoints / f".{name}.adapter.old").mkdir(parents=True)
    (checkpoints / ".last.adapter.old" / "adapter_config.json").write_text("{}")
    (checkpoints / "last.adapter").mkdir()  # the replacement made it in
    (checkpoints / "last.adapter" / "adapter_config.json").write_text('{"new": 1}')
    assert tidy_run_dir(tmp_path) == []  # best's has no adapter_config.json: not an adapter to bring back
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.adapter"]
    assert (checkpoints / "last.adapter" / "adapter_config.json").read_text() == '{"new": 1}'
    assert tidy_run_dir(tmp_path / "elsewhere") == []  # no checkpoints folder: nothing to put in order
    # Pairs it cannot compare are not named: an adapter of an earlier version (no step recorded), a checkpoint
    # that is a folder (a distributed checkpoint, which llasmol does not write), a damaged one (named where it is used).
    from llasmol.core.files import write_torch

    write_torch(checkpoints / "early.ckpt", {"global_step": 3})
    (checkpoints / "early.adapter").mkdir()
    for name in ("sharded", "damaged"):
        (checkpoints / f"{name}.adapter").mkdir()
        (checkpoints / f"{name}.adapter" / "trainer_state.json").write_text('{"global_step": 2}')
    (checkpoints / "sharded.ckpt").mkdir()
    (checkpoints / "damaged.ckpt").write_bytes(b"not a checkpoint")
    assert tidy_run_dir(tmp_path) == []


def test_a_stop_at_a_step_boundary_saves_interrupted_ckpt_and_says_how_to_continue(tmp_path, monkeypatch, caplog):
    """Ctrl-C or SIGTERM raised by `StopAtStepBoundary` (marked `at_step_boundary`) saves interrupted.ckpt on the
    resume checkpoint only; any other exception, or a stop elsewhere, saves nothing (last.ckpt resumes)."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    def stop(kind, at_boundary=True):
        exc = kind()
        if at_boundary is not None:
            exc.at_step_boundary = at_boundary
        return exc

    def saves(callback, exception, rank_zero=True):
        saved = []
        monkeypatch.setattr(callback, "save_now", lambda trainer, path: saved.append(path))
        trainer = SimpleNamespace(is_global_zero=rank_zero, global_step=5, default_root_dir=str(tmp_path))
        callback.on_exception(trainer, None, exception)
        return saved

    resume = AdapterModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), resume=True)
    interrupted = str(tmp_path / "checkpoints" / "interrupted.ckpt")
    with caplog.at_level("WARNING", logger="llasmol.finetune.checkpointing"):
        assert saves(resume, stop(KeyboardInterrupt)) == [interrupted]
    assert caplog.messages == [f"interrupted at step 5, saved {interrupted}; continue with:\n  "
                               f"python -m llasmol.train hydra.run.dir={tmp_path} ckpt_path=last"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="llasmol.finetune.checkpointing"):
        assert saves(resume, stop(SIGTERMException)) == [interrupted]
        assert saves(resume, stop(KeyboardInterrupt), rank_zero=False) == [interrupted]  # every rank saves
    assert len(caplog.messages) == 1  # rank 0 alone says so
    assert saves(resume, stop(KeyboardInterrupt, at_boundary=False)) == []  # the second Ctrl-C: at once
    assert saves(resume, stop(KeyboardInterrupt, at_boundary=None)) == []  # Lightning's own handling
    assert saves(resume, stop(ValueError)) == []  # a failure is no stop on purpose
    assert AdapterModelCheckpoint().resume is False  # the best-checkpoint instance by default
    assert saves(AdapterModelCheckpoint(dirpath=str(tmp_path)), stop(KeyboardInterrupt)) == []
    assert saves(AdapterModelCheckpoint(resume=True), stop(KeyboardInterrupt)) == []  # no folder to save into


def test_the_resume_checkpoint_saves_the_step_reaching_max_steps_and_the_end_of_training(monkeypatch):
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    monkeypatch.setattr(ModelCheckpoint, "on_train_batch_end", lambda self, *args: None)
    monkeypatch.setattr(ModelCheckpoint, "on_train_end", lambda self, *args: None)

    def saved_at_batch_end(resume, max_steps, step):
        callback = AdapterModelCheckpoint(resume=resume)
        saved = []
        monkeypatch.setattr(callback, "save_last_unless_saved", lambda trainer: saved.append(trainer.global_step))
        callback.on_train_batch_end(SimpleNamespace(max_steps=max_steps, global_step=step), None, None, None, 0)
        return saved == [step]

    assert saved_at_batch_end(True, 3, 3) and saved_at_batch_end(True, 3, 4) and saved_at_batch_end(True, 1, 1)
    assert not saved_at_batch_end(True, 3, 2)  # before max_steps: the periodic saves only
    assert not saved_at_batch_end(True, -1, 5) and not saved_at_batch_end(True, 0, 5)  # no step limit
    assert not saved_at_batch_end(False, 3, 3)  # the best-checkpoint instance never writes last.ckpt
    for resume in (True, False):
        callback = AdapterModelCheckpoint(resume=resume)
        saved = []
        monkeypatch.setattr(callback, "save_last_unless_saved", lambda trainer: saved.append(trainer))
        callback.on_train_end("trainer", None)
        assert saved == (["trainer"] if resume else [])


def test_an_adapter_is_committed_with_its_checkpoint_dropped_without_it_and_removed_with_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from llasmol.finetune import checkpointing
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    committed = []
    monkeypatch.setattr(checkpointing, "commit_adapter", lambda staged, target: committed.append((staged, target)))
    callback = AdapterModelCheckpoint(dirpath=str(tmp_path))
    staged = {}
    for name in ("a", "b"):
        staged[name] = tmp_path / f".{name}.adapter.staged"
        staged[name].mkdir()
        callback._staged[str(tmp_path / f"{name}.ckpt")] = staged[name]
    callback.after_save(None, str(tmp_path / "a.ckpt"), saved=True)
    assert committed == [(staged["a"], tmp_path / "a.adapter")]
    callback.after_save(None, str(tmp_path / "b.ckpt"), saved=False)  # the .ckpt write failed
    assert not staged["b"].exists() and len(committed) == 1
    callback.after_save(None, str(tmp_path / "c.ckpt"), saved=True)  # nothing staged (not rank 0): nothing to do
    assert len(committed) == 1 and callback._staged == {}

    (tmp_path / "old.adapter").mkdir()
    callback.after_remove(SimpleNamespace(is_global_zero=False), str(tmp_path / "old.ckpt"))
    assert (tmp_path / "old.adapter").is_dir()  # rank 0 alone removes
    callback.after_remove(SimpleNamespace(is_global_zero=True), str(tmp_path / "old.ckpt"))
    assert not (tmp_path / "old.adapter").exists()
    callback.after_remove(SimpleNamespace(is_global_zero=True), str(tmp_path / "old.ckpt"))  # no adapter: no error
    callback._staged[str(tmp_path / "d.ckpt")] = tmp_path / "gone"
    callback.after_save(None, str(tmp_path / "d.ckpt"), saved=False)  # nothing left to drop: no error either


def test_an_adapters_card_holds_a_validation_only_at_the_step_it_was_made(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from llasmol.finetune import checkpointing
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    cards, staged = [], []
    monkeypatch.setattr(checkpointing, "adapter_card", lambda facts, metrics, step: cards.append((facts, metrics, step))
                        or "CARD")
    monkeypatch.setattr(checkpointing, "stage_adapter",
                        lambda model, target, state, card, step: staged.append((model, target, state, card, step))
                        or tmp_path / "staged")
    module = SimpleNamespace(model="peft", last_validated_step=4,
                             adapter_state_dict=lambda state: {k[len("model."):]: v for k, v in state.items()
                                                               if k == "model.w"})

    def save(step, rank_zero=True, facts=None):
        callback = AdapterModelCheckpoint(dirpath=str(tmp_path))
        callback.card_facts = facts
        strategy = SimpleNamespace(lightning_module_state_dict=lambda: {"model.w": 1, "model.frozen": 2})
        trainer = SimpleNamespace(lightning_module=module, strategy=strategy, is_global_zero=rank_zero, global_step=step,
                                  callback_metrics={"val/loss": torch.tensor(0.5), "train/loss": torch.tensor(1.0)})
        callback.before_save(trainer, str(tmp_path / "x.ckpt"))
        return callback._staged

    assert save(4, facts={"base": "b"}) == {str(tmp_path / "x.ckpt"): tmp_path / "staged"}
    assert cards == [({"base": "b"}, {"val/loss": 0.5}, 4)]  # val/ numbers only, as floats
    assert staged == [("peft", tmp_path / "x.adapter", {"w": 1}, "CARD", 4)]
    save(5, facts={"base": "b"})  # saved at step 5's end, before any validation of step 5
    assert cards[-1] == ({"base": "b"}, {}, 5)
    save(6)  # no facts (not trained by `train`): no card
    assert staged[-1][3] is None and len(cards) == 2
    assert save(4, rank_zero=False, facts={"base": "b"}) == {} and len(staged) == 3  # rank 0 alone writes


def test_only_rank_0_locks_and_tidies_the_run_folder(tmp_path, monkeypatch):
    """Every DDP process makes sure the folder exists; the lock and the tidying are rank 0's, once."""
    from lightning.pytorch.utilities import rank_zero_only

    from llasmol.finetune import preflight

    done = []
    monkeypatch.setattr(preflight, "hold_run_lock", lambda out: done.append(("lock", out)))
    monkeypatch.setattr(preflight, "tidy_run_dir", lambda out: done.append(("tidy", out)) or [])
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert preflight.claim_run_dir(str(tmp_path / "a" / "run")) == tmp_path / "a" / "run"
    assert (tmp_path / "a" / "run").is_dir() and done == []
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    preflight.claim_run_dir(tmp_path / "a" / "run")
    assert done == [("lock", tmp_path / "a" / "run"), ("tidy", tmp_path / "a" / "run")]


@pytest.mark.parametrize("override, message", [
    ("optimizer._target_=bitsandbytes.optim.PagedAdamW8bit", "pages its state through CUDA memory"),
    ("+logger.w={_target_:llasmol.finetune.tracking.WandbLogger,log_model:true,offline:true}", "needs an online run"),
    ("model=galactica data.packing=true", "data.packing=true needs a Llama- or Mistral-family base"),
])
def test_the_preflight_check_names_what_this_machine_cannot_run(override, message, monkeypatch):
    from llasmol.core.config import compose_config
    from llasmol.finetune.preflight import check_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose_config(["paths.output_dir=/x", "logger=csv", *override.split()])
    with pytest.raises(UserError, match=re.escape(message)):
        check_run(cfg)
    check_run(compose_config(["paths.output_dir=/x", "logger=csv"]))  # the default run: fine
