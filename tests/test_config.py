"""Config composition: every model × lora combination, the paper's recipe, and command-line overrides."""

from __future__ import annotations

import hydra
import pytest

from conftest import compose_config
from refusals import refused, refused_cli

from llasmol.core.config import CONFIG_DIR
from llasmol.model.base import arch_facts

# Every option of the groups, discovered: a new model or LoRA file is composed and checked with the rest.
MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
LORAS = sorted(p.stem for p in (CONFIG_DIR / "lora").glob("*.yaml"))
QUANTIZATIONS = sorted(p.stem for p in (CONFIG_DIR / "quantization").glob("*.yaml"))
# model=hf (a base that is not listed) needs its Hub id and folder; the folder's config.json is read only
# when the model is built (tests/test_hf_base.py).
GIVEN = {"hf": ["model.name=someone/any-base", "model.path=/tmp/unused-base"]}
HF_IDS = {
    "mistral": "mistralai/Mistral-7B-v0.1",
    "llama2": "meta-llama/Llama-2-7b-hf",
    "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "codellama": "codellama/CodeLlama-7b-hf",
    "galactica": "facebook/galactica-6.7b",
}


@pytest.mark.parametrize("lora", LORAS)
@pytest.mark.parametrize("model", MODELS)
def test_every_model_lora_combination_composes(model, lora):
    cfg = compose_config([f"model={model}", f"lora={lora}", "paths.output_dir=/tmp/unused", *GIVEN.get(model, [])])
    # An explicit model wins the composition; the settings check then refuses lora=large on another base.
    assert cfg.model.name == ("someone/any-base" if model == "hf" else model)
    assert cfg.lora.name == lora
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (16, 16, 0.05)
    assert cfg.lora.train_head == (lora == "plus")
    for role in cfg.lora.targets:  # model=hf reads its map from the base's module names
        assert role in cfg.model.lora_targets if model != "hf" else cfg.model.lora_targets is None


def test_large_switches_the_base_to_llama2_13b():
    cfg = compose_config(["lora=large", "paths.output_dir=/tmp/unused"])
    assert cfg.model.name == "llama2_13b"
    assert cfg.model.hf_id == "meta-llama/Llama-2-13b-hf"
    assert list(cfg.lora.targets) == ["q", "k", "v", "o", "gate", "up", "down"]
    assert cfg.optimizer.lr == 1e-4  # the 13B base brings the paper's recipe with it


@pytest.mark.parametrize("model", [m for m in MODELS if m != "tiny"])
def test_real_bases_get_the_paper_recipe(model):
    cfg = compose_config([f"model={model}", "lora=full", "paths.output_dir=/tmp/unused", *GIVEN.get(model, [])])
    assert cfg.model.hf_id == HF_IDS.get(model, cfg.model.hf_id) and cfg.model.hf_id.count("/") == 1
    if model != "hf":  # its shapes are bundled (model=hf's are its folder's config.json)
        assert arch_facts(cfg.model.arch)["model_type"]
    assert cfg.model.dtype == "bfloat16"
    # Qwen3-8B is a chat checkpoint: its own chat template by default; every other base the paper's string.
    assert cfg.model.prompt_template == ("chat_template" if model == "qwen3" else "[INST] {input} [/INST]")
    assert cfg.data._target_.endswith("SMolInstructDataModule") and cfg.data.path is None
    assert cfg.data.hub_id == "osunlp/SMolInstruct"
    assert cfg.data.tasks is None  # every task the data has: all 14 of the archive
    assert (cfg.data.micro_batch_size, cfg.data.effective_batch_size, cfg.data.max_length) == (4, 512, 512)
    assert cfg.data.train_on_inputs is True and cfg.data.group_by_length is False  # random micro-batches
    assert cfg.optimizer._target_ == "bitsandbytes.optim.AdamW8bit" and cfg.optimizer.lr == 1e-4
    assert cfg.scheduler._target_ == "transformers.get_cosine_schedule_with_warmup"
    assert cfg.scheduler.num_warmup_steps == 1000
    assert cfg.trainer.max_epochs == 3 and cfg.trainer.precision == "bf16-mixed"
    assert cfg.seed == 13 and cfg.val_every_n_steps == 200
    assert cfg.callbacks.model_checkpoint.monitor == "val/loss" and cfg.callbacks.model_checkpoint.mode == "min"


def test_default_is_the_embedded_cpu_demo():
    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    assert cfg.model.name == "tiny" and cfg.lora.name == "full"
    assert cfg.trainer.accelerator == "cpu"
    assert cfg.data.path.endswith("llasmol/data/bundled")
    assert cfg.data.prompt_template == cfg.model.prompt_template


@pytest.mark.parametrize("model", MODELS)
def test_evaluate_and_generate_carry_only_the_groups_they_use(model):
    evaluate = compose_config([f"model={model}", "paths.output_dir=/x"], "evaluate")
    generate = compose_config([f"model={model}"], "generate")
    train = compose_config([f"model={model}", "paths.output_dir=/x"])
    for cfg in (evaluate, generate):
        assert not {"trainer", "optimizer", "scheduler", "callbacks", "logger", "lora"} & set(cfg)
        assert cfg.generation == train.generation  # the base's generation settings, as in training
    assert "data" not in generate and evaluate.data.path == train.data.path
    assert evaluate.data.split == "test"


def test_audit_carries_the_data_group_alone():
    cfg = compose_config(["paths.output_dir=/x"], "audit")
    assert not {"model", "trainer", "optimizer", "callbacks", "logger", "lora", "generation"} & set(cfg)
    assert cfg.data.path.endswith("llasmol/data/bundled")
    assert list(cfg.held_out) == ["validation", "test"] and cfg.fail_on_duplicates is True and cfg.workers is None
    full = compose_config(["data=smolinstruct", "data.path=/data/SMolInstruct", "paths.output_dir=/x"], "audit")
    assert full.data.path == "/data/SMolInstruct" and dict(full.data.splits) == {"train": "train", "validation": "dev",
                                                                                   "test": "test"}


def test_model_files_hold_model_facts_only():
    """No model file picks other groups: what a base implies is in conf/setup/ alone."""
    for path in (CONFIG_DIR / "model").glob("*.yaml"):
        text = path.read_text()
        assert "override" not in text and "@package _global_" not in text, path.name
        assert (CONFIG_DIR / "setup" / "model" / path.name).is_file(), f"conf/setup/model/{path.name} is missing"


def test_targets_of_the_configs_resolve():
    cfg = compose_config(["model=mistral", "paths.output_dir=/tmp/unused"])
    for node in (cfg.optimizer, cfg.scheduler, cfg.data, cfg.trainer, cfg.callbacks.model_checkpoint):
        assert callable(hydra.utils.get_object(node._target_))


def test_trainer_and_hydra_overrides_pass_through():
    cfg = compose_config(["trainer.max_steps=3", "trainer.devices=2", "data.micro_batch_size=2", "paths.output_dir=/x"])
    assert cfg.trainer.max_steps == 3 and cfg.trainer.devices == 2 and cfg.data.micro_batch_size == 2
    assert cfg.callbacks.model_checkpoint.dirpath == "/x/checkpoints"


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("model", MODELS)
def test_every_model_quantization_combination_composes(model, quantization):
    cfg = compose_config([f"model={model}", f"quantization={quantization}", "paths.output_dir=/tmp/unused"])
    if quantization == "none":
        assert cfg.quantization.bits is None
    else:
        assert cfg.quantization.bits == int(quantization[0])
        assert cfg.gradient_checkpointing
    # A quantised base trains with its recipe's optimizer: the paper's 8-bit AdamW, torch's on the tiny CPU demo.
    assert cfg.optimizer._target_ == ("torch.optim.AdamW" if model == "tiny" else "bitsandbytes.optim.AdamW8bit")
    if quantization == "4bit":
        assert (cfg.quantization.quant_type, cfg.quantization.double_quant, cfg.quantization.compute_dtype) == (
            "nf4", True, "bfloat16")


def test_the_ablation_experiment_sweeps_the_paper_variants_on_llama2():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from llasmol.core.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=lora_ablation"], return_hydra_config=True)
    assert cfg.model.name == "llama2" and cfg.optimizer.lr == 1e-4
    assert cfg.hydra.sweeper.params.lora == "lite,attn,ffn,full,plus"


def test_the_demo_ablation_sweeps_four_variants_of_the_tiny_model_briefly():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from llasmol.core.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=demo_ablation"], return_hydra_config=True)
    assert cfg.model.name == "tiny" and cfg.hydra.sweeper.params.lora == "lite,attn,ffn,full"
    # Short and validated twice (two points per loss curve) on a few samples, with little generation: the
    # README's minutes (BENCHMARKS.md section 14).
    assert (cfg.trainer.max_steps, cfg.val_every_n_steps, cfg.trainer.max_epochs) == (100, 50, -1)
    assert dict(cfg.data.max_samples_per_task) == {"validation": 8}
    assert cfg.callbacks.generation_evaluator.samples_per_task == 2 and cfg.generation.max_new_tokens_limit == 16
    assert list(cfg.logger) == ["csv"] and cfg.optimizer.lr == 3e-3  # the demo recipe's


def test_paper_recipe_uses_the_papers_beam_settings_for_every_task():
    """App. A.1 and what the official runs effectively did: (beams, returned sequences, max new tokens),
    1024 new tokens for every task (config.py's 20/960 were never applied), early_stopping off."""
    from llasmol.core.tasks import TASK_NAMES
    from llasmol.inference.beam_search import task_settings

    want = {
        "forward_synthesis": (8, 5),
        "retrosynthesis": (13, 10),
        "molecule_generation": (8, 5),
        "name_conversion-i2s": (8, 5),
        "name_conversion-s2i": (8, 5),
        "name_conversion-i2f": (6, 3),
        "name_conversion-s2f": (6, 3),
        "molecule_captioning": (4, 1),
        **{t: (4, 1) for t in TASK_NAMES if t.startswith("property_prediction-")},
    }
    cfg = compose_config(["model=mistral"])
    assert set(want) == set(TASK_NAMES)
    for task, (beams, returned) in want.items():
        got = task_settings(cfg.generation, task)
        assert (got.num_beams, got.num_return_sequences, got.max_new_tokens, got.early_stopping) == (
            beams, returned, 1024, False), task
    assert cfg.generation.max_prompt_tokens == 512


def test_gpu_presets_run_fp32_when_put_on_cpu():
    assert compose_config(["trainer=ddp", "paths.output_dir=/x"]).trainer.precision == "bf16-mixed"
    cpu_ddp = compose_config(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "paths.output_dir=/x"])
    assert cpu_ddp.trainer.precision == "32-true" and cpu_ddp.trainer.strategy == "ddp"
    assert compose_config(["trainer=ddp", "trainer.accelerator=cpu", "trainer.precision=bf16-mixed",
                           "paths.output_dir=/x"]).trainer.precision == "bf16-mixed"  # asked for, given


@pytest.mark.parametrize("command,override,named", [
    ("train", "data.max_length=0", ["data.max_length=0"]),
    ("train", "data.max_length=-1", ["data.max_length=-1"]),
    ("train", "lora.r=0", ["lora.r=0"]),
    ("params", "lora.r=0", ["lora.r=0"]),
    ("params", "model=hf", ["model.name and model.path are not set", "model.name=<its Hub id> model.path=<folder"]),
    ("params", "model=hf model.path=/base", ["model.name", "???", "model.name=<value>"]),
    ("train", "optimizer.lr=nan", ["optimizer.lr=nan"]),
    ("train", "optimizer.lr=-0.001", ["optimizer.lr=-0.001"]),
    ("train", "trainer.max_steps=-5", ["trainer.max_steps=-5"]),
    ("train", "trainer.max_steps=0", ["trainer.max_steps=0"]),
    ("train", "val_every_n_steps=2.5", ["val_every_n_steps=2.5"]),
    ("train", "lora.dropout=1.0", ["lora.dropout=1.0"]),
    ("train", "data.micro_batch_size=true", ["data.micro_batch_size=True"]),
    ("evaluate", "generation.batch_size=0", ["generation.batch_size=0"]),
    ("evaluate", "generation.tasks.retrosynthesis.num_beams=0", ["generation.tasks.retrosynthesis.num_beams=0"]),
    ("generate", "generation.default.num_return_sequences=5",
     ["generation.default.num_return_sequences=5", "num_beams=4"]),
    ("audit", "workers=0", ["workers=0"]),
    ("audit", "examples=-1", ["examples=-1"]),
    ("baseline", "morgan.n_bits=2047", ["morgan.n_bits=2047"]),
    ("baseline", "nearest_neighbor.table_rows=0", ["nearest_neighbor.table_rows=0"]),
])
def test_settings_outside_their_values_are_named(command, override, named):
    from llasmol.core.schema import check_config

    with refused(*named):
        check_config(compose_config([*override.split(), "paths.output_dir=/x"] if command != "generate" else [override],
                                      command))


@pytest.mark.parametrize("command", ["train", "evaluate", "generate", "params", "audit", "baseline"])
def test_every_shipped_configuration_passes_its_schema(command):
    from llasmol.core.schema import check_config

    if command == "audit":  # no model group: the data groups it reads
        for data in ("bundled", "smolinstruct"):
            check_config(compose_config([f"data={data}", "paths.output_dir=/x"], command))
        return
    extra = ["paths.output_dir=/x"] if command in ("train", "evaluate", "baseline") else []
    extra += ["ckpt=none"] if command == "evaluate" else []  # something to evaluate
    choices = [[f"model={model}"] for model in ("tiny", "mistral", "llama2", "llama2_13b", "codellama", "galactica")]
    if command in ("train", "params"):
        choices += [["model=mistral", f"lora={lora}"] for lora in ("lite", "attn", "ffn", "plus")]
        choices += [["lora=large"], ["model=llama2_13b", "lora=large"]]
    if command == "baseline":  # no model: its choices are the methods
        choices = [[f"method={method}"] for method in ("rdkit", "opsin", "fingerprint", "nearest_neighbor")]
    for overrides in choices:
        check_config(compose_config([*overrides, *extra], command))


@pytest.mark.parametrize("command", ["train", "params"])
def test_large_on_another_base_is_refused(command):
    from llasmol.core.schema import check_config

    extra = ["paths.output_dir=/x"] if command == "train" else []
    for model in ("mistral", "llama2", "tiny"):
        cfg = compose_config([f"model={model}", "lora=large", *extra], command)
        assert cfg.lora.name == "large" and cfg.model.name == model  # what would have run: a 7B "large"
        with refused("lora=large", "model=llama2_13b", f"model={model}"):
            check_config(cfg)
    check_config(compose_config(["model=llama2_13b", "lora=large", *extra], command))


@pytest.mark.parametrize("argv", [["lora=large", "model=mistral"], ["--multirun", "lora=full,large", "model=mistral"]])
def test_large_on_another_base_stops_the_command_line_before_anything_runs(tmp_path, argv):
    refused_cli(["llasmol.train", *argv, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                tmp_path, "lora=large", "model=llama2_13b", "model=mistral", "lora=full",
                untouched=tmp_path)  # no run nor sweep folder: lora=full did not run either


def test_the_seed_is_stated_once():
    """One default seed for every command (conf/shared.yaml); the groups refer to it as ${seed}."""
    from llasmol.core.config import CONFIG_DIR

    stated = sorted(str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml")
                    if any(line.strip().startswith("seed:") and "${" not in line for line in p.read_text().splitlines()))
    assert stated == ["intervals/default.yaml", "shared.yaml"]  # the bootstrap's own seed, and the one seed
    for command in ("train", "evaluate", "generate", "baseline", "audit"):
        extra = [] if command == "generate" else ["paths.output_dir=/x"]
        assert compose_config(["seed=7", *extra], command).seed == 7
        assert compose_config(extra, command).seed == 13


def test_a_stopped_multirun_says_how_to_run_the_jobs_that_had_not_started(tmp_path, capsys):
    """Ctrl-C in job 1 of four: the last lines say how to continue job 1 and name the two jobs not started, to
    run into the same folder numbered on (a real Ctrl-C: tests/test_resume.py; a continued sweep:
    tests/test_train.py)."""
    from omegaconf import OmegaConf

    from llasmol.core.config import SweepSummary, remaining_jobs_command

    sweep = (tmp_path / "sweep").resolve()
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    given = ["lora=lite,attn,ffn,full", "data.max_samples_per_task={train:8}"]

    def config(num=None, task="train", launcher=basic, first_job=0):
        lora = None if num is None else ["lite", "attn", "ffn", "full"][num]
        return OmegaConf.create({"task_name": task, "first_job": first_job, "hydra": {
            "launcher": {"_target_": launcher}, "sweep": {"dir": str(sweep)}, "job": {"num": num},
            "runtime": {"output_dir": str(sweep / f"{num}_tiny_{lora}")},
            "overrides": {"task": given if num is None else [f"lora={lora}", given[1]]}}})

    # A training job stopped before its first checkpoint kept nothing: it runs again with the rest, no ckpt_path
    summary = SweepSummary()
    summary.on_multirun_start(config())
    summary.on_job_start(config(0))
    summary._said_if_stopped()
    said = capsys.readouterr().err
    assert "ckpt_path=last" not in said and said.splitlines()[1] == (
        "  the jobs that had not finished run into the same folder with: python -m llasmol.train --multirun "
        f"lora=lite,attn,ffn,full 'data.max_samples_per_task={{train:8}}' hydra.sweep.dir={sweep} first_job=0")
    for job in ("0_tiny_lite", "1_tiny_attn"):  # jobs that trained far enough to keep a checkpoint
        (sweep / job / "checkpoints").mkdir(parents=True)
        (sweep / job / "checkpoints" / "last.ckpt").write_bytes(b"")
    summary = SweepSummary()
    summary.on_multirun_start(config())
    summary.on_job_start(config(0))
    summary.on_job_end(config(0))
    summary.on_job_start(config(1))
    summary._said_if_stopped()  # what the process says as it exits
    assert capsys.readouterr().err.splitlines() == [
        "multirun stopped in job 1",
        f"  continue it with: python -m llasmol.train lora=attn 'data.max_samples_per_task={{train:8}}' "
        f"hydra.run.dir={sweep / '1_tiny_attn'} ckpt_path=last",
        "  the jobs that had not started run into the same folder with: python -m llasmol.train --multirun "
        f"lora=ffn,full 'data.max_samples_per_task={{train:8}}' hydra.sweep.dir={sweep} first_job=2"]
    summary._said_if_stopped()
    assert capsys.readouterr().err == ""  # said once
    # A continued sweep (first_job=2) numbers its jobs on: stopped in its first, that is job 2.
    summary = SweepSummary()
    summary.on_multirun_start(config(first_job=2))
    summary.on_job_start(config(0))
    summary._said_if_stopped()
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "multirun stopped in job 2" and said[-1].endswith(f"hydra.sweep.dir={sweep} first_job=3")
    # Stopped between two jobs (job 0 done, job 1 not started): nothing to continue, the rest to run.
    summary = SweepSummary()
    summary.on_multirun_start(config())
    summary.on_job_start(config(0))
    summary.on_job_end(config(0))
    summary._said_if_stopped()
    assert capsys.readouterr().err.splitlines() == [
        "multirun stopped after job 0",
        "  the jobs that had not started run into the same folder with: python -m llasmol.train --multirun "
        f"lora=attn,ffn,full 'data.max_samples_per_task={{train:8}}' hydra.sweep.dir={sweep} first_job=1"]
    # A baseline keeps nothing of a stopped job: it runs again with the rest.
    summary = SweepSummary()
    summary.on_multirun_start(config(task="baseline"))
    summary.on_job_start(config(0, "baseline"))
    summary._said_if_stopped()
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  the jobs that had not finished run into the same folder with: python -m llasmol.baseline --multirun "
        f"lora=lite,attn,ffn,full 'data.max_samples_per_task={{train:8}}' hydra.sweep.dir={sweep} first_job=0"]
    # A multirun that ran to its end says only where its folder is; another launcher's jobs run elsewhere.
    for launcher, ended in ((basic, True), ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
                                            False)):
        summary = SweepSummary()
        summary.on_multirun_start(config(launcher=launcher))
        summary.on_job_start(config(0, launcher=launcher))
        if ended:
            summary.on_multirun_end(config(launcher=launcher))
        summary._said_if_stopped()
        assert "multirun stopped" not in capsys.readouterr().err
    # Two swept keys stopped mid-way: two sweeps, each numbered on; none left: nothing to run.
    assert remaining_jobs_command("train", ["lora=lite,attn", "optimizer.lr=1e-4,3e-4,1e-3", "first_job=4"], 1,
                                  "/s", 4) == (
        "python -m llasmol.train --multirun lora=lite optimizer.lr=0.001 hydra.sweep.dir=/s first_job=6 && "
        "python -m llasmol.train --multirun lora=attn optimizer.lr=0.0001,0.0003,0.001 hydra.sweep.dir=/s first_job=7")
    assert remaining_jobs_command("baseline", ["method=rdkit,opsin"], 1, "/s") == ""
    # A setting not swept before the swept ones, and swept dict and quoted values: each value is written back as
    # it was typed (quoted anew, Hydra would read the dict as a string, or the quotes as part of the text).
    assert remaining_jobs_command("train", ["seed=1", "lora=lite,attn", "data.max_samples_per_task={train:8},{train:16}"],
                                  0, "/s") == (
        "python -m llasmol.train --multirun seed=1 lora=lite 'data.max_samples_per_task={train:16}' hydra.sweep.dir=/s "
        "first_job=1 && python -m llasmol.train --multirun seed=1 lora=attn "
        "'data.max_samples_per_task={train:8},{train:16}' hydra.sweep.dir=/s first_job=2")
    assert remaining_jobs_command("train", ["model.prompt_template='Q: {input}','{input}'", "lora=lite,attn"], 1,
                                  "/s") == (
        "python -m llasmol.train --multirun 'model.prompt_template='\"'\"'{input}'\"'\"'' lora=lite,attn "
        "hydra.sweep.dir=/s first_job=2")


def _os_facing(monkeypatch, folder, writable=True, read_only=False, free_bytes=10 << 30):
    """What the file system says of `folder` (a mount makes these for real: tests/test_files.py, slow)."""
    import os
    import shutil
    from types import SimpleNamespace

    real_access, real_statvfs, real_usage = os.access, os.statvfs, shutil.disk_usage
    mine = str(folder)
    monkeypatch.setattr(os, "access", lambda p, mode: writable if str(p) == mine else real_access(p, mode))
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(
        f_flag=os.ST_RDONLY if read_only else 0, f_bavail=free_bytes // 4096, f_frsize=4096, f_blocks=1 << 20)
        if str(p) == mine else real_statvfs(p))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(free=1 << 40) if str(p) == mine
                        else real_usage(p))


@pytest.mark.parametrize("writable, read_only, free, said", [
    (False, False, 10 << 30, "is not writable by this user, so the run folder"),
    (False, True, 10 << 30, "is on a read-only file system, so the run folder"),
    (True, False, 100 << 10, "no space left on device (0.00 GB free there)"),  # f_bavail below 256 KiB
    (True, False, 256 << 10, None),
])
def test_a_run_folder_that_cannot_be_written_is_refused_naming_the_nearest_existing_folder(
        tmp_path, monkeypatch, capsys, writable, read_only, free, said):
    import sys

    from llasmol.core.config import check_command_line, check_writable

    _os_facing(monkeypatch, tmp_path, writable, read_only, free)
    target = tmp_path / "runs" / "a"  # not made yet: its nearest existing folder is the one asked
    if said is None:
        check_writable(target)
        return
    with refused(said, tmp_path):
        check_writable(target)
    # A command writing a run folder says so as one line, exit 2, before Hydra; one that writes none (generate
    # prints its answers) is not stopped by where it was started.
    monkeypatch.setattr(sys, "argv", ["llasmol.generate", f"hydra.run.dir={target}", "task=forward_synthesis",
                                      "ckpt=none", "query=CCO"])
    check_command_line("generate")
    with pytest.raises(SystemExit) as stop:
        check_command_line("generate", run_folder=True)
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_the_resolvers_the_configs_use(monkeypatch):
    """What `${llasmol_...:}` gives each config that names it (the configs: conf/**/*.yaml)."""
    import sys
    from pathlib import Path

    from omegaconf import OmegaConf

    import llasmol

    cfg = OmegaConf.create({
        "asset": "${llasmol_asset:data/bundled}", "offline": "${llasmol_wandb_offline:}",
        "job": "${llasmol_job_number:3,4}", "cpu": "${llasmol_precision:cpu}", "gpu": "${llasmol_precision:gpu}",
        "interactive": "${llasmol_interactive:}"})
    bundled = Path(llasmol.__file__).parent / "data" / "bundled"
    assert cfg.asset == str(bundled) and bundled.is_dir()
    assert cfg.job == 7  # job 3 of a sweep continued from job 4
    assert (cfg.cpu, cfg.gpu) == ("32-true", "bf16-mixed")
    for mode, offline in ((None, True), ("offline", True), ("disabled", True), ("online", False), (" Online", False)):
        if mode is None:
            monkeypatch.delenv("WANDB_MODE", raising=False)
        else:
            monkeypatch.setenv("WANDB_MODE", mode)
        assert cfg.offline is offline, mode
    # Progress bars only on a terminal.
    monkeypatch.setattr(sys, "stdout", type("Tty", (), {"isatty": lambda self: True})())
    assert cfg.interactive is True
    monkeypatch.setattr(sys, "stdout", type("Pipe", (), {"isatty": lambda self: False})())
    assert cfg.interactive is False


def test_compose_config_works_where_hydra_was_left_initialized():
    """A notebook's bare `initialize_config_dir(...)` (not in a `with`) leaves Hydra initialized."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3")
    try:
        assert GlobalHydra.instance().is_initialized()
        assert compose_config(["seed=5"], "generate").seed == 5
    finally:
        GlobalHydra.instance().clear()


def test_the_overrides_of_a_command_line_leave_out_hydras_options_and_their_values():
    from llasmol.core.config import overrides_of

    assert overrides_of(["--multirun", "lora=lite,attn", "--cfg", "job", "-p", "trainer", "seed=1"]) == [
        "lora=lite,attn", "seed=1"]
    assert overrides_of(["a=1", "--config-name", "evaluate", "-cd", "/conf", "b=2"]) == ["a=1", "b=2"]
    assert overrides_of(["x=1", "-c"]) == ["x=1"]  # an option last: nothing after it to take
    # --info takes a value only optionally: a key=value after it is a setting.
    assert overrides_of(["--info", "config", "a=1"]) == ["a=1"]
    assert overrides_of(["--info", "a=1"]) == ["a=1"]
    assert overrides_of(["~logger.wandb", "+b=2"]) == ["~logger.wandb", "+b=2"]  # a deletion has no "="


def test_the_run_folder_a_command_line_names():
    from pathlib import Path

    from llasmol.core.config import named_run_dir

    assert named_run_dir(["a=1", "--multirun"]) is None
    assert named_run_dir(["hydra.run.dir=/a", "x=1", "hydra.run.dir=/c"]) == Path("/c")  # the last one wins
    assert named_run_dir(["+hydra.sweep.dir=/s=1"]) == Path("/s=1")


def test_command_line_values_are_the_given_ones_else_the_defaults():
    from llasmol.core.config import command_line_values

    defaults = {"seed": 13, "first_job": 0, "lr": 5, "x": 9}
    values = command_line_values(["--multirun", "seed=1,2", "+first_job=3", "other=1", "lr=6", "lr=7"], defaults)
    assert values["first_job"] == 3 and values["lr"] == 7 and values["x"] == 9 and "other" not in values
    assert list(values["seed"].list) == [1, 2]  # a sweep counts as given
    assert defaults == {"seed": 13, "first_job": 0, "lr": 5, "x": 9}
    assert command_line_values(["lora"], defaults) == defaults  # a line that cannot be read: check_overrides says why


def test_check_overrides_says_a_bad_argument_choice_key_or_value_in_one_line():
    from llasmol.core.config import check_overrides

    for overrides, named in ((["lora"], ["'lora'", "key=value", "key='a b'"]),
                             (["model=mistrall"], ["model=mistrall", ", ".join(MODELS)]),
                             (["trainer.max_stepz=1"], ["trainer.max_stepz", "llasmol.train", "+trainer.max_stepz="]),
                             (["generation.batch_size=0"], ["generation.batch_size=0"])):
        with refused(*named):
            check_overrides("generate" if overrides[0].startswith("gen") else "train", overrides)


def test_check_overrides_composes_each_value_of_a_sweep_and_gives_the_commands_check_each_config():
    from hydra.errors import HydraException

    from llasmol.core.config import check_overrides

    seen = []
    check_overrides("generate", ["seed=1,2", "query=CCO"], check=lambda cfg: seen.append((cfg.seed, cfg.query)))
    assert seen == [(13, "CCO"), (1, "CCO"), (2, "CCO")]  # the plain settings, then each swept value with them

    def hydra_says(cfg):
        raise HydraException("  first line of Hydra's message\nthe rest of it")

    with refused("first line of Hydra's message") as seen:
        check_overrides("generate", [], check=hydra_says)
    assert seen.message == seen.message.strip()  # the first line alone, without Hydra's indent


def test_a_run_folder_under_a_file_is_refused(tmp_path):
    from llasmol.core.config import check_writable

    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    with refused(f"{notes} is not a folder", notes / "run", "hydra.run.dir="):
        check_writable(notes / "run")
    check_writable(tmp_path / "new" / "run")  # a folder that does not exist yet, under a writable one


def test_a_bad_setting_on_the_command_line_is_one_error_line_and_exit_2(monkeypatch, capsys):
    import sys

    from llasmol.core.config import check_command_line

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", ["llasmol.generate", "generation.batch_size=0"])
    with pytest.raises(SystemExit) as stop:
        check_command_line("generate")
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: generation.batch_size=0 must be an integer >= 1 and <= 65536"]


def _multirun(sweep, overrides, num=None, task="train", first_job=0, job_overrides=None):
    """The config Hydra hands a SweepSummary hook: the multirun's (num None) or job `num`'s."""
    from omegaconf import OmegaConf

    return OmegaConf.create({"task_name": task, "first_job": first_job, "hydra": {
        "launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"},
        "sweep": {"dir": str(sweep)}, "job": {"num": num}, "runtime": {"output_dir": str(sweep / f"job{num}")},
        "overrides": {"task": overrides if num is None else job_overrides}}})


def test_a_multirun_that_ends_says_where_its_folder_is(tmp_path, capsys, monkeypatch):
    from llasmol.core import config as config_module
    from llasmol.core.config import SweepSummary

    registered = []
    monkeypatch.setattr(config_module.atexit, "register", registered.append)
    sweep = (tmp_path / "sweep").resolve()
    for task, said in (("train", True), ("baseline", True), ("evaluate", False)):
        summary = SweepSummary()
        summary.on_multirun_start(_multirun(sweep, ["seed=1,2"], task=task))
        # A stop is said as the process exits (Hydra calls no end hook then): registered for train and baseline.
        assert registered[-1:] == ([summary._said_if_stopped] if said else [])
        registered.clear()
        summary.on_multirun_end(_multirun(sweep, ["seed=1,2"], task=task))
        assert capsys.readouterr().out == (
            f"sweep folder: {sweep}\n  compare its variants: python -m llasmol.report {sweep}\n" if said else "")


def test_a_multirun_stopped_before_its_first_job_says_to_run_them_all(tmp_path, capsys, monkeypatch):
    from llasmol.core import config as config_module
    from llasmol.core.config import SweepSummary

    monkeypatch.setattr(config_module.atexit, "register", lambda said: None)  # not at this test process's exit

    sweep = (tmp_path / "sweep").resolve()
    summary = SweepSummary()
    summary.on_multirun_start(_multirun(sweep, ["lora=lite,attn"]))
    summary._said_if_stopped()
    assert capsys.readouterr().err.splitlines() == [
        "multirun stopped in job 0",
        "  the jobs that had not started run into the same folder with: python -m llasmol.train --multirun "
        f"lora=lite,attn hydra.sweep.dir={sweep} first_job=0"]


def test_continuing_a_stopped_job_repeats_its_settings_as_typed(tmp_path, capsys, monkeypatch):
    """Hydra's job overrides say `0.0001` for a typed `1e-4`: the command said is the one the user typed, without
    the sweep's own `first_job`; the stopped job was the last, so nothing else is left to run."""
    from llasmol.core import config as config_module
    from llasmol.core.config import SweepSummary, remaining_jobs_command

    monkeypatch.setattr(config_module.atexit, "register", lambda said: None)  # not at this test process's exit

    sweep = (tmp_path / "sweep").resolve()
    (sweep / "job1" / "checkpoints").mkdir(parents=True)  # the stopped job kept a checkpoint to continue from
    (sweep / "job1" / "checkpoints" / "interrupted.ckpt").write_bytes(b"")
    given = ["lora=lite,attn", "optimizer.lr=1e-4", "first_job=3"]
    summary = SweepSummary()
    summary.on_multirun_start(_multirun(sweep, given, first_job=3))
    summary.on_job_start(_multirun(sweep, given, 1, first_job=3,
                                   job_overrides=["lora=attn", "optimizer.lr=0.0001", "first_job=3"]))
    summary._said_if_stopped()
    assert capsys.readouterr().err.splitlines() == [
        "multirun stopped in job 4",
        f"  continue it with: python -m llasmol.train lora=attn optimizer.lr=1e-4 hydra.run.dir={sweep / 'job1'} "
        "ckpt_path=last"]
    assert remaining_jobs_command("train", ["optimizer.lr=1e-4", "lora=lite,attn"], 0, "/s") == (
        "python -m llasmol.train --multirun optimizer.lr=1e-4 lora=attn hydra.sweep.dir=/s first_job=1")


@pytest.mark.parametrize("argument", ["lora", "model.prompt_template=Q: {input}", "data.tasks=[forward_synthesis",
                                      "a b=1", "x=y)"])
def test_an_argument_hydra_cannot_parse_is_named_whatever_hydras_parser_says(argument):
    """Hydra's parse error names the argument only for some mistakes ("mismatched input '{' expecting <EOF>" for
    an unquoted value with a space); the line says which argument, and how to quote it, for each."""
    from llasmol.core.config import check_overrides

    with refused(f"'{argument}'", "key=value", "key='a b'"):
        check_overrides("train", ["seed=1", argument])


@pytest.mark.parametrize("args,named", [
    (["model=mistrall"], ["model=mistrall", "codellama", "galactica", "gemma2", "hf", "llama2", "llama2_13b", "llama31",
                          "mistral_nemo", "mistral_v03", "olmo2", "qwen25", "qwen3", "tiny"]),
    # Each value of a sweep is checked before the first job runs.
    (["--multirun", "lora=lite,fulll"], ["lora=fulll", "attn, ffn, full"]),
    (["trainer.max_stepz=3"], ["trainer.max_stepz", "llasmol.train"]),
    (["max_steps"], ["'max_steps'", "key=value"]),
])
def test_a_mistyped_choice_or_setting_is_one_line_before_anything_runs(tmp_path, args, named):
    refused_cli(["llasmol.train", *args, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                tmp_path, *named, untouched=tmp_path)  # no job started


def test_good_command_lines_pass_the_check():
    from llasmol.core.config import check_overrides, overrides_of

    check_overrides("train", overrides_of(["--multirun", "lora=lite,attn,ffn,full", "model=tiny", "--cfg", "job",
                                           "hydra/launcher=submitit_local", "model.prompt_template='a b {input}'", "--info",
                                           "config"]))
    with refused("extra", "is not a setting of the command line"):  # a new top-level key would never be applied
        check_overrides("train", ["+extra.key='a b'"])
    check_overrides("evaluate", ["ckpt=/some/run", "data.split=test", "data.tasks=[forward_synthesis]"])
    check_overrides("generate", ["task=forward_synthesis", "ckpt=none"])
    check_overrides("audit", ["data=smolinstruct", "data.path=/data/SMolInstruct", "held_out=[test]", "workers=2"])
    # A sweep of dicts, lists or quoted text: each value is checked as the value it is, not as a string.
    check_overrides("train", ["data.max_samples_per_task={train:8},{train:16}", "data.tasks=[forward_synthesis],null",
                              "model.prompt_template='Q: {input}','{input}'"])
    with refused("data.max_samples_per_task={'train': -1}"):
        check_overrides("train", ["data.max_samples_per_task={train:8},{train:-1}"])
    with refused("'forward_synthesiss'", "data.tasks"):
        check_overrides("train", ["data.tasks=[forward_synthesis],[forward_synthesiss]"])
    assert overrides_of(["-cn", "train", "--info", "a=1", "-m", "b=2"]) == ["a=1", "b=2"]


@pytest.mark.parametrize("argument, said", [
    ("init_from=~/runs/a", "a path starting with ~ is not expanded there; give it whole, e.g. init_from=$HOME/runs/a"),
    ("data.path=~", "give it whole, e.g. data.path=$HOME"),
    ("model.prompt_template=a,b}", "settings are key=value (quote values with spaces or commas"),
])
def test_an_argument_hydra_cannot_read_is_named_with_the_fix_for_its_kind(argument, said):
    """A ~ after '=' is left as it is by the shell: quoting cannot help it, the whole path can."""
    from llasmol.core.config import check_overrides

    with refused(f"cannot read the argument '{argument}'", said):
        check_overrides("train", [argument])
