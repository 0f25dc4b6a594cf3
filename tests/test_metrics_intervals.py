"""Bootstrap intervals and paired comparisons from per-sample statistics."""

from __future__ import annotations

import numpy as np
import pytest

from llasmol.metrics.intervals import bootstrap_intervals, paired_difference, per_sample_statistics
from llasmol.metrics.scoring import score_records

BBBP = "property_prediction-bbbp"
S2F = "name_conversion-s2f"


def boolean_records(correct: list[bool], gold: str = "Yes") -> list[dict]:
    other = {"Yes": "No", "No": "Yes"}[gold]
    return [{"task": BBBP, "index": i, "input": f"q{i}", "gold": gold,
             "predictions": [f"<BOOLEAN> {gold if ok else other} </BOOLEAN>"]} for i, ok in enumerate(correct)]


def test_intervals_cover_the_true_accuracy_at_about_the_nominal_rate():
    rng = np.random.default_rng(7)
    true, n, trials, covered = 0.7, 80, 150, 0
    for trial in range(trials):
        records = boolean_records(list(rng.random(n) < true))
        lo, hi = bootstrap_intervals(per_sample_statistics(records), resamples=400, seed=trial)[BBBP]["accuracy"]
        covered += lo <= true <= hi
    assert 0.88 <= covered / trials <= 0.99  # nominal 0.95; percentile intervals run a little narrow at n=80


def test_the_interval_brackets_the_value_and_narrows_with_more_samples():
    small = boolean_records([True, False] * 20)
    large = boolean_records([True, False] * 400)
    (lo_s, hi_s), (lo_l, hi_l) = (bootstrap_intervals(per_sample_statistics(r))[BBBP]["accuracy"] for r in (small, large))
    assert lo_s < 0.5 < hi_s and lo_l < 0.5 < hi_l
    assert (hi_l - lo_l) < (hi_s - lo_s) / 3  # sqrt(20) times narrower in theory
    assert hi_s - lo_s == pytest.approx(2 * 1.96 * np.sqrt(0.25 / 40), rel=0.2)


def test_a_metric_without_variance_has_a_point_interval():
    intervals = bootstrap_intervals(per_sample_statistics(boolean_records([True] * 30)))[BBBP]
    assert intervals["accuracy"] == [1.0, 1.0]
    assert "num_samples" not in intervals and "tp" not in intervals  # counts get no interval


def pooled_records() -> list[dict]:
    """5 inputs, 20 samples each (one gold each, pooled per input); an input is answered right or wrong
    in all its samples: 5 independent units, not 100."""
    records = []
    for unit, right in enumerate([True, True, False, False, False]):
        for j in range(20):
            gold = "C2H6O" if j % 2 else "C2H6O"  # one formula, spelled once
            records.append({"task": S2F, "index": len(records), "input": f"prompt {unit}.{j}",
                            "raw_input": f"molecule {unit}", "gold": gold,
                            "predictions": ["<MOLFORMULA> C2H6O </MOLFORMULA>" if right else "<MOLFORMULA> CH4 </MOLFORMULA>"]})
    return records


def test_pooled_tasks_resample_inputs_not_samples():
    records = pooled_records()
    samples = per_sample_statistics(records)
    assert samples[S2F].n_units == 5 and len(samples[S2F].units) == 100
    lo, hi = bootstrap_intervals(samples, resamples=2000)[S2F]["exact_match"]
    assert score_records(records)[S2F]["exact_match"] == pytest.approx(0.4)
    assert hi - lo > 0.6  # 5 units: sd of the mean ~0.22; as 100 independent samples it would be ~0.19 wide
    unpooled = [{**r, "raw_input": f"molecule {i}"} for i, r in enumerate(records)]
    lo_u, hi_u = bootstrap_intervals(per_sample_statistics(unpooled), resamples=2000)[S2F]["exact_match"]
    assert hi_u - lo_u < 0.3


def test_intervals_are_repeatable_and_follow_the_seed():
    rng = np.random.default_rng(0)
    samples = per_sample_statistics([{"task": "property_prediction-esol", "input": f"q{i}", "gold": f"{g:.3f}",
                                      "predictions": [f"<NUMBER> {g + e:.3f} </NUMBER>"]}
                                     for i, (g, e) in enumerate(zip(rng.normal(size=40), rng.normal(size=40)))])
    assert bootstrap_intervals(samples, seed=3) == bootstrap_intervals(samples, seed=3)
    assert bootstrap_intervals(samples, seed=3) != bootstrap_intervals(samples, seed=4)


def test_a_run_compared_with_itself_differs_by_exactly_zero():
    records = boolean_records([True, False, True, True] * 10) + pooled_records()
    result = paired_difference(records, records, {BBBP: "accuracy", S2F: "exact_match"})
    for task in (BBBP, S2F):
        assert result[task]["difference"] == 0.0
        assert result[task]["interval"] == [0.0, 0.0]
        assert result[task]["excludes_zero"] is False


def test_paired_comparisons_see_a_real_gap_that_unpaired_intervals_blur():
    rng = np.random.default_rng(1)
    hard = rng.random(200) < 0.5  # samples both models find hard
    a = boolean_records(list(~hard | (rng.random(200) < 0.3)))
    b_right = np.array([r["predictions"][0] == "<BOOLEAN> Yes </BOOLEAN>" for r in a])
    b_right[np.flatnonzero(b_right)[::8]] = False  # B: A's answers, one right answer in 8 lost
    b = boolean_records(list(b_right))
    result = paired_difference(a, b, {BBBP: "accuracy"})[BBBP]
    assert result["difference"] > 0 and result["excludes_zero"]
    ia = bootstrap_intervals(per_sample_statistics(a))[BBBP]["accuracy"]
    ib = bootstrap_intervals(per_sample_statistics(b))[BBBP]["accuracy"]
    assert ia[0] < ib[1]  # each model's own intervals overlap: alone they could not tell the two apart
    assert result["samples"] == 200


def test_only_samples_both_runs_scored_are_compared():
    a = boolean_records([True] * 10)
    b = boolean_records([False] * 6)
    result = paired_difference(a, b, {BBBP: "accuracy", S2F: "exact_match"})
    assert set(result) == {BBBP} and result[BBBP]["samples"] == 6 and result[BBBP]["difference"] == 1.0
