"""Shared fixtures: offline settings, composed Hydra configs, the official-layout fixture data."""

from __future__ import annotations

import functools
import json
import os
import socket
import sys

# Tests never download: the Hub is off, W&B stays local. Set before anything imports huggingface_hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# gloo process groups in tests talk over loopback only.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
# OpenMP threads that wait sleep at once instead of spinning, as in the commands (conf/cpu/): before anything
# here loads torch, and inherited by the commands the tests start. On a machine shared with other work a
# spinning wait slows a 2-core torch process tens of times (bench/cpu_threads.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf
from smolinstruct_fixture import write_smolinstruct

from llasmol.core.config import CONFIG_DIR, compose_config  # noqa: F401  (tests import it from here)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """`.ci/run` spreads the tests one by one over its processes (`--dist loadgroup`), so that no process is left
    with a few long files while the other idles; a test that uses a module-scoped fixture (the 2-process training
    runs of test_multiprocess.py, a trained run read by many tests) goes with its file's others that use it, to the
    process that builds the fixture once."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs.values() if fixtures is not None else ()
        if any(d and d[-1].scope == "module" for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))

# Every command a test starts does bounded work (a few steps of the tiny model, a handful of samples), so a
# time limit there only catches a hang: it is an hour, far above the slowest such command seen on 2 cores
# shared with other work (a multirun of three jobs: 10 minutes at load 2-12). LLASMOL_TEST_TIMEOUT sets it.
HANG_TIMEOUT = int(os.environ.get("LLASMOL_TEST_TIMEOUT", 3600))

# The paper's seed and token length as conf/ states them (their one home), for tests that compare against them.
SEED = OmegaConf.load(CONFIG_DIR / "shared.yaml").seed
MAX_LENGTH = OmegaConf.load(CONFIG_DIR / "data" / "smolinstruct.yaml").max_length


@functools.lru_cache(maxsize=None)
def _data_settings() -> tuple:
    data = OmegaConf.to_container(compose_config(["paths.output_dir=/unused"]).data, resolve=True)
    return tuple((k, v) for k, v in data.items() if k != "_target_")


def make_datamodule(tokenizer, **settings):
    """The DataModule the `data` group builds (conf/data/smolinstruct.yaml), with `settings` in place of some."""
    from llasmol.data.datamodule import SMolInstructDataModule

    return SMolInstructDataModule(tokenizer, **{**dict(_data_settings()), **settings})


# A training run as short as a command-line test needs: two steps of the tiny model, each validated on a
# sample of each of two tasks with answers of at most 4 tokens.
TWO_TASKS = "data.tasks=[name_conversion-s2f,property_prediction-esol]"
QUICK = ["trainer.max_steps=2", "val_every_n_steps=1", "logger=csv", "trainer.enable_progress_bar=false",
         "callbacks.generation_evaluator.samples_per_task=1", "generation.max_new_tokens_limit=4"]


def free_port() -> int:
    """A free local TCP port for a gloo process group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def smol_root(tmp_path_factory) -> Path:
    """A small SMolInstruct copy in the official layout (5 tasks, train/dev/test)."""
    return write_smolinstruct(tmp_path_factory.mktemp("smolinstruct"))


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One short run of the tiny model (LoRA lite, 4 steps, validations at steps 2 and 4 with two answers per
    task), trained once per test process for the tests that only read a run. Never written to: a test that
    writes into a run works on its own copy (`shutil.copytree`; a copied run keeps its best checkpoint by name).
    It holds what `python -m llasmol.train` leaves beside the checkpoints: the resolved config in .hydra/."""
    from llasmol.train import train

    out = tmp_path_factory.mktemp("trained") / "run"
    cfg = compose_config([f"paths.output_dir={out}", "lora=lite", "trainer.max_steps=4", "val_every_n_steps=2",
                          "data.max_samples_per_task={validation:6}", "generation.max_new_tokens_limit=8",
                          "callbacks.generation_evaluator.samples_per_task=2", "trainer.log_every_n_steps=1",
                          "trainer.enable_progress_bar=false", "logger=csv"])
    result = train(cfg)
    (out / ".hydra").mkdir()
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
    (out / "callback_metrics.json").write_text(json.dumps(result["metrics"]))
    return out


def leave_spawned_rank() -> None:
    """End an `mp.spawn` rank whose work is written, without C++ static destructors: at interpreter exit gloo's
    store thread, still joinable on a loaded machine, aborted the rank ("terminate called without an active
    exception", SIGABRT) after it had passed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture
def cfg_factory(tmp_path):
    """Compose the train config with overrides, writing into this test's temporary folder."""

    def make(*overrides: str) -> DictConfig:
        # W&B costs seconds per run; its own tests ask for it.
        logger = [] if any(o.startswith("logger=") for o in overrides) else ["logger=csv"]
        return compose_config([f"paths.output_dir={tmp_path}", *logger, *overrides])

    return make


@pytest.fixture
def ablation_titles(monkeypatch) -> list[str]:
    """The titles `report` gives its ablation charts, in order (each chart is still drawn)."""
    from llasmol import analysis

    titles, drawn = [], analysis.plot_ablation

    def recording(data, path, title, **kwargs):
        titles.append(title)
        return drawn(data, path, title, **kwargs)

    monkeypatch.setattr(analysis, "plot_ablation", recording)
    return titles


@pytest.fixture(autouse=True)
def _torch_threads_as_they_were():
    """Commands called in-process set torch's thread count for their run (`use_cpu_threads`) and keep it: put it
    back, so no test runs slower, or differently, for what an earlier one asked."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def one_process_group(monkeypatch):
    """A gloo process group of one process, and its device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
