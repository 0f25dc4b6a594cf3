"""Validation generation under DDP: 2 CPU processes (gloo) give the same metrics and records as 1."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
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


# (this rank's sample indices on rank 0, on rank 1) of FakeSplit(4): 0-2 forward_synthesis, 3-6 name_conversion-s2f;
# batches of 2, so a task of 3 samples takes 2 generate calls.
UNEVEN = {
    "a call apart": ([0, 1, 2], [0, 1]),  # 2 calls against 1
    "a whole batch apart": ([0, 1, 2, 3, 4], []),  # 3 calls against none
    "by task, not by count": ([0, 3], [0, 1]),  # two samples each, but one task's batch each on rank 0: 2 against 1
    "already answered": ([0, 1, 2, 3], [3, 4, 5, 6]),  # rank 0's forward_synthesis answered before: 1 against 2
}


def _lockstep(rank: int, world: int, port: int, out: str) -> None:
    sys.path.insert(0, str(TESTS))
    # A rank that fails exits at once (mp.spawn then stops the other), and no collective waits past a minute.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    from test_inference_parts import GENERATION, CharFormatter, DecodeTokenizer, EchoModel, FakeSplit

    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.inference.pipeline import ModelAnswers, Samples
    from llasmol.metrics.scoring import GoldPool

    counts = {}
    for name, shares in UNEVEN.items():
        model = EchoModel()
        generator = BeamGenerator(model, DecodeTokenizer(), CharFormatter(), batch_size=2)
        generator.lockstep = True  # as a sharded model's: its forwards are collective
        done = ({i: {"index": i, "task": "forward_synthesis"} for i in range(3)}
                if name == "already answered" and rank == 0 else None)
        records = ModelAnswers(generator, GENERATION, done=done).answer(
            Samples(FakeSplit(4), shares[rank], GoldPool()))
        counts[name] = {"records": len(records), "calls": [(c["num_beams"], c["max_new_tokens"], c["synced_gpus"],
                                                            len(c["input_ids"])) for c in model.calls]}
    Path(out).with_suffix(f".{rank}.json").write_text(json.dumps(counts))
    dist.barrier()
    dist.destroy_process_group()
    leave_spawned_rank()


def test_sharded_ranks_with_uneven_shares_make_as_many_generate_calls(tmp_path):
    """Under FSDP2 every forward is collective: a rank with fewer batches must idle as many one-token calls as the
    busiest rank has batches more, counted per task (a task's last batch may be short), after its own batches."""
    mp.spawn(_lockstep, args=(2, free_port(), str(tmp_path / "calls")), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"calls.{rank}.json").read_text()) for rank in (0, 1)]
    idle = [1, 1, True, 1]  # (beams, new tokens, synced, rows) of an idle call
    own = {"a call apart": ([2, 1], [0, 1]), "a whole batch apart": ([3, 0], [0, 3]),  # (batches, idle calls) a rank
           "by task, not by count": ([2, 1], [0, 1]), "already answered": ([1, 2], [1, 0])}
    for name, (batches, idles) in own.items():
        for rank in (0, 1):
            calls = ranks[rank][name]["calls"]
            assert len(calls) == max(batches), (name, rank)
            assert ranks[rank][name]["records"] == len(UNEVEN[name][rank])
            assert all(c[1:3] == [8, True] for c in calls[: batches[rank]]), (name, rank)  # its own batches first
            assert calls[batches[rank]:] == [idle] * idles[rank], (name, rank)
