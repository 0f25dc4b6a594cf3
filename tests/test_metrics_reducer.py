"""`ChemistryMetrics`: summed torchmetrics states give the same numbers as scoring everything at once."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.utilities.data import dim_zero_sum
from conftest import free_port, leave_spawned_rank
from refusals import refused
from test_metrics import RECORDS

from llasmol.metrics import STATS, ChemistryMetrics, sample_stats, score_records
from llasmol.metrics.reducer import state_name
from llasmol.metrics.scoring import record_golds

TASKS = sorted({r["task"] for r in RECORDS})


def _samples(records):
    golds = dict(zip(map(id, RECORDS), record_golds(RECORDS)))
    return [r["task"] for r in records], [sample_stats(r["task"], r["predictions"], golds[id(r)]) for r in records]


def _assert_same(got, want):
    assert set(got) == set(want)
    for task in want:
        assert set(got[task]) == set(want[task]), task
        for key, value in want[task].items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got[task][key]), (task, key)
            else:
                assert got[task][key] == pytest.approx(value), (task, key)


def test_states_are_float64_sums_for_every_task_stat():
    metric = ChemistryMetrics(TASKS)
    for task in TASKS:
        for stat in STATS[task]:
            name = state_name(task, stat)
            state = getattr(metric, name)
            assert state.dtype == torch.float64 and state.ndim == 0
            assert metric._reductions[name] is dim_zero_sum  # ranks' states add up, as the stats do
            assert metric._defaults[name].item() == 0.0


def test_compute_equals_score_records_and_skips_unseen_tasks():
    metric = ChemistryMetrics(TASKS)
    tasks, stats = _samples(RECORDS)
    metric.update(tasks, stats)
    _assert_same(metric.compute(), score_records(RECORDS))
    empty = ChemistryMetrics(["forward_synthesis", "retrosynthesis"])
    empty.update(["forward_synthesis"], [sample_stats("forward_synthesis", ["<SMILES> C </SMILES>"], ["C"])])
    assert set(empty.compute()) == {"forward_synthesis"}


def test_two_instances_merged_equal_one():
    tasks, stats = _samples(RECORDS)
    whole = ChemistryMetrics(TASKS)
    whole.update(tasks, stats)
    rank0, rank1 = ChemistryMetrics(TASKS), ChemistryMetrics(TASKS)
    rank0.update(tasks[::2], stats[::2])
    rank1.update(tasks[1::2], stats[1::2])
    # what DDP's sum reduction does: add the states
    added = ChemistryMetrics(TASKS)
    added.update([], [])  # marks it updated, adds nothing
    for task in TASKS:
        for stat in STATS[task]:
            name = state_name(task, stat)
            setattr(added, name, getattr(rank0, name) + getattr(rank1, name))
    _assert_same(added.compute(), whole.compute())
    # torchmetrics' own merge uses the registered reductions
    rank0.merge_state(rank1)
    _assert_same(rank0.compute(), whole.compute())


def test_update_rejects_bad_input():
    metric = ChemistryMetrics(["forward_synthesis"])
    with pytest.raises(ValueError, match="not one of"):
        metric.update(["retrosynthesis"], [{}])
    with pytest.raises(ValueError, match="not a statistic"):
        metric.update(["forward_synthesis"], [{"tp": 1.0}])
    with pytest.raises(ValueError, match="tasks but"):
        metric.update(["forward_synthesis"], [])
    with refused("'nope'"):
        ChemistryMetrics(["nope"])
    assert metric.compute() == {}


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        tasks, stats = _samples(RECORDS[rank::world])
        metric = ChemistryMetrics(TASKS)
        metric.update(tasks, stats)
        result = metric.compute()  # syncs: states summed over ranks
        # a rank without samples must still take part in the sync (and not hang)
        lopsided = ChemistryMetrics(TASKS)
        if rank == 0:
            lopsided.update(*_samples(RECORDS))
        lopsided_result = lopsided.compute()
        if rank == 0:
            torch.save((result, lopsided_result), out)
    finally:
        dist.destroy_process_group()
    leave_spawned_rank()


@pytest.mark.slow
def test_real_ddp_two_ranks_equal_one(tmp_path):
    """Two gloo processes, each with half the samples (or one with all), give the one-process numbers."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "result.pt")
    mp.spawn(_ddp_worker, args=(2, free_port(), out), nprocs=2, join=True)
    split, lopsided = torch.load(out)
    _assert_same(split, score_records(RECORDS))
    _assert_same(lopsided, score_records(RECORDS))
