"""Validation generation under DDP: 2 CPU processes (gloo) give the same metrics and records as 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import SEED, free_port, leave_spawned_rank

TESTS = Path(__file__).resolve().parent


def _evaluate(rank: int, world: int, port: int, out: str) -> None:
    sys.path.insert(0, str(TESTS))
    if world > 1:
        # A TCP store, not a file store: the file store's last-one-out cleanup raced at exit in CI (SIGABRT).
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        _evaluate_rank(rank, world, out)
    finally:
        if world > 1:
            dist.barrier()  # neither rank tears gloo down while the other still talks to it
            dist.destroy_process_group()
    if world > 1:
        leave_spawned_rank()


def _evaluate_rank(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    import hydra
    from conftest import compose_config

    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.inference.loading import load_model
    from llasmol.inference.pipeline import ModelAnswers, Samples, gather_to_all
    from llasmol.metrics.reducer import reduced_metrics

    cfg = compose_config(["paths.output_dir=/unused", "generation.max_new_tokens_limit=6"])
    model, tok = load_model(cfg.model, None)
    dm = hydra.utils.instantiate(cfg.data, tokenizer=tok, _convert_="all")
    samples = Samples.of(dm.source, "validation", 3, seed=SEED)
    generator = BeamGenerator(model, tok, dm.formatter, batch_size=4)
    # The callback's own path: each rank takes its stride, metrics sync, records gather.
    records = ModelAnswers(generator, cfg.generation).answer(samples.share(rank, world))
    results = reduced_metrics(records, list(samples.split.tasks), torch.device("cpu"))
    everything = sorted(gather_to_all(records), key=lambda r: r["index"])
    Path(out).with_suffix(f".{rank}.json").write_text(json.dumps({"metrics": results, "records": everything}))


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    _evaluate(0, 1, 0, str(tmp_path / "single"))
    mp.spawn(_evaluate, args=(2, free_port(), str(tmp_path / "ddp")), nprocs=2, join=True)
    single = json.loads((tmp_path / "single.0.json").read_text())
    for rank in (0, 1):
        ddp = json.loads((tmp_path / f"ddp.{rank}.json").read_text())
        assert ddp["records"] == single["records"]
        assert ddp["metrics"] == single["metrics"]
    assert len(single["records"]) == 33
