"""Bootstrap intervals and paired comparisons from per-sample statistics."""

from __future__ import annotations

import json
import math

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


# --------------------------------------------------------------------------- exact levels and decisions
# k right answers among n samples: a resample's accuracy is Binomial(n, k/n) / n exactly, so each interval
# end is a known binomial quantile. n=32, k=9 keeps every 90/95/99% end at least 4 standard errors of the
# empirical CDF (20,000 resamples) away from a jump, and the three levels 1-2 grid steps apart on each side.
N, K, RESAMPLES = 32, 9, 20_000


def binomial_interval(n: int, k: int, level: float) -> list[float]:
    """The central `level` interval of Binomial(n, k/n) / n: the ends a percentile bootstrap converges to."""
    p, tail, cdf, total = k / n, (1 - level) / 2, [], 0.0
    for i in range(n + 1):
        total += math.comb(n, i) * p**i * (1 - p) ** (n - i)
        cdf.append(total)
    lo = next(i for i, c in enumerate(cdf) if c > tail)
    hi = next(i for i, c in enumerate(cdf) if c >= 1 - tail)
    return [lo / n, hi / n]


def test_the_binomial_ends_tell_the_three_levels_apart():
    ends = {level: binomial_interval(N, K, level) for level in (0.90, 0.95, 0.99)}
    assert ends == {0.90: [5 / 32, 13 / 32], 0.95: [4 / 32, 14 / 32], 0.99: [3 / 32, 16 / 32]}


@pytest.mark.parametrize("level", [0.90, 0.95, 0.99])
def test_each_end_of_the_interval_is_the_quantile_of_its_level(level):
    records = boolean_records([i < K for i in range(N)])
    lo, hi = bootstrap_intervals(per_sample_statistics(records), RESAMPLES, seed=1, level=level)[BBBP]["accuracy"]
    expected_lo, expected_hi = binomial_interval(N, K, level)
    assert lo == pytest.approx(expected_lo, abs=1e-9)
    assert hi == pytest.approx(expected_hi, abs=1e-9)


def test_the_configured_level_is_the_level_computed_and_written(cfg_factory, tmp_path):
    from llasmol.inference.pipeline import Evaluation, RunFiles

    records = boolean_records([i < K for i in range(N)])
    for level in (0.95, 0.90):
        overrides = [f"intervals.resamples={RESAMPLES}"] + ([] if level == 0.95 else [f"intervals.level={level}"])
        cfg = cfg_factory(*overrides)
        assert cfg.intervals.level == level  # 0.95 is the default
        files = RunFiles(None, tmp_path / f"m{level}.json")
        # evaluate and the baselines pass the config group, validations a plain dict of it
        for settings in (cfg.intervals, dict(cfg.intervals)):
            result = Evaluation(files, settings).finish(records).intervals
            assert result == json.loads(files.intervals.read_text())
            assert result["level"] == level
            lo, hi = result["tasks"][BBBP]["accuracy"]
            assert [lo, hi] == pytest.approx(binomial_interval(N, K, level), abs=1e-9)


def right_on(indices: set[int], n: int = N) -> list[dict]:
    return boolean_records([i in indices for i in range(n)])


@pytest.mark.parametrize("level", [0.90, 0.95, 0.99])
def test_a_paired_difference_has_the_exact_interval_and_sign_in_both_orders(level):
    better, worst = right_on(set(range(K))), right_on(set())  # A - B: A's own accuracy in every resample
    expected = binomial_interval(N, K, level)
    ahead = paired_difference(better, worst, {BBBP: "accuracy"}, RESAMPLES, seed=1, level=level)[BBBP]
    behind = paired_difference(worst, better, {BBBP: "accuracy"}, RESAMPLES, seed=1, level=level)[BBBP]
    assert ahead["difference"] == pytest.approx(K / N) and behind["difference"] == pytest.approx(-K / N)
    assert ahead["interval"] == pytest.approx(expected, abs=1e-9)
    assert behind["interval"] == pytest.approx([-expected[1], -expected[0]], abs=1e-9)
    assert ahead["excludes_zero"] is True and behind["excludes_zero"] is True


def test_a_difference_straddling_or_touching_zero_is_not_a_difference():
    a, b = right_on(set(range(0, 9))), right_on(set(range(9, 18)))  # equally good on different samples
    straddles = paired_difference(a, b, {BBBP: "accuracy"}, 2000)[BBBP]
    assert straddles["difference"] == 0.0
    assert straddles["interval"][0] < 0 < straddles["interval"][1] and straddles["excludes_zero"] is False
    # One right answer more in 32: a resample misses it with probability (31/32)^32 = 0.36, so the lower
    # end is exactly 0: on zero, not beyond it.
    for one, none in ((right_on({0}), right_on(set())), (right_on(set()), right_on({0}))):
        touching = paired_difference(one, none, {BBBP: "accuracy"}, 2000)[BBBP]
        assert 0.0 in touching["interval"] and touching["excludes_zero"] is False


def test_a_resample_draws_whole_pooled_inputs():
    from llasmol.metrics.intervals import _weights

    pooled = per_sample_statistics(pooled_records())[S2F]  # 5 inputs of 20 samples
    weights = _weights(np.random.default_rng(0), pooled, 4000)
    by_unit = weights.reshape(4000, 5, 20)
    assert (by_unit == by_unit[:, :, :1]).all()  # an input's samples are drawn together
    assert (weights.sum(axis=1) == 100).all()  # 5 draws of 20 samples each
    distinct = (by_unit[:, :, 0] > 0).sum(axis=1)
    # Distinct inputs among 5 draws from 5: mean 5 * (1 - 0.8^5) = 3.36; as 100 samples it would be ~63.
    assert distinct.max() <= 5 and distinct.mean() == pytest.approx(5 * (1 - 0.8**5), abs=0.05)
    single = per_sample_statistics(boolean_records([True] * 100))[BBBP]
    distinct = (_weights(np.random.default_rng(0), single, 4000) > 0).sum(axis=1)
    assert distinct.mean() == pytest.approx(100 * (1 - 0.99**100), abs=0.3)


def test_a_pooled_interval_moves_in_steps_of_one_input():
    records = [r for r in pooled_records() if r["raw_input"] != "molecule 1"][:80]  # 1 right input of 4
    lo, hi = bootstrap_intervals(per_sample_statistics(records), RESAMPLES)[S2F]["exact_match"]
    assert [lo, hi] == binomial_interval(4, 1, 0.95) == [0.0, 0.75]  # as 80 samples: about [0.16, 0.34]


# --------------------------------------------------------------------------- defaults, counts and unindexed files


def _resample_counts(monkeypatch) -> list[int]:
    """How many resampled values each interval is taken over (one list per metric and task)."""
    from llasmol.metrics import intervals as module

    counts, percentiles = [], module._percentiles

    def counting(values, level):
        counts.append(len(values))
        return percentiles(values, level)

    monkeypatch.setattr(module, "_percentiles", counting)
    return counts


def esol_records(shift: float) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"task": ESOL, "index": i, "input": f"q{i}", "gold": f"{g:.3f}",
             "predictions": [f"<NUMBER> {g + e + shift:.3f} </NUMBER>"]}
            for i, (g, e) in enumerate(zip(rng.normal(size=40), rng.normal(size=40)))]


ESOL = "property_prediction-esol"


def test_the_defaults_are_1000_resamples_seed_0_and_95_percent(monkeypatch):
    a, b = esol_records(0.0), esol_records(0.5)
    samples = per_sample_statistics(a)
    counts = _resample_counts(monkeypatch)
    default = bootstrap_intervals(samples)
    assert counts and set(counts) == {1000}  # 7 chunks of 128 and one of 104, not one resample more or less
    assert default == bootstrap_intervals(samples, 1000, 0, 0.95)
    assert default != bootstrap_intervals(samples, 1000, 1, 0.95)
    assert default != bootstrap_intervals(samples, 1000, 0, 0.9)
    counts.clear()
    assert bootstrap_intervals(samples, resamples=130)[ESOL]["rmse"] is not None
    assert set(counts) == {130}  # a chunk of 128 and one of 2
    counts.clear()
    paired = paired_difference(a, b, {ESOL: "rmse"})[ESOL]
    assert counts == [1000]
    assert paired == paired_difference(a, b, {ESOL: "rmse"}, 1000, 0, 0.95)[ESOL]
    assert paired["interval"] != paired_difference(a, b, {ESOL: "rmse"}, 1000, 1, 0.95)[ESOL]["interval"]
    assert paired["interval"] != paired_difference(a, b, {ESOL: "rmse"}, 1000, 0, 0.9)[ESOL]["interval"]
    counts.clear()
    paired_difference(a, b, {ESOL: "rmse"}, 130)
    assert counts == [130]


def test_an_interval_report_needs_resamples_and_samples():
    from llasmol.metrics.intervals import interval_report, wants_intervals

    settings = {"resamples": 50, "seed": 0, "level": 0.9}
    samples = per_sample_statistics(boolean_records([True, False, True]))
    assert not wants_intervals(None) and not wants_intervals({"resamples": 0}) and wants_intervals(settings)
    assert interval_report(samples, None) is None
    assert interval_report(samples, {**settings, "resamples": 0}) is None
    assert interval_report({}, settings) is None  # nothing scored: no file
    report = interval_report(samples, settings)
    assert {k: report[k] for k in ("level", "resamples", "seed")} == {"level": 0.9, "resamples": 50, "seed": 0}
    assert set(report["tasks"]) == {BBBP}


def test_files_without_indices_pair_samples_by_input_and_order():
    """Another system's output has no split indices: the n-th sample with an input in A is the n-th with that
    input in B; an input B lacks, or a repeat B has fewer of, is left out."""
    def unindexed(pairs):
        return [{"task": BBBP, "input": x, "gold": "Yes", "predictions": [f"<BOOLEAN> {answer} </BOOLEAN>"]}
                for x, answer in pairs]

    a = unindexed([("q", "Yes"), ("q", "Yes"), ("r", "Yes"), ("s", "No")])
    b = unindexed([("q", "No"), ("r", "Yes"), ("t", "No")])
    result = paired_difference(a, b, {BBBP: "accuracy"}, 50)[BBBP]
    assert result["samples"] == 2  # (q, 1st) and r
    assert result["a"] == 1.0 and result["b"] == 0.5 and result["difference"] == 0.5


@pytest.mark.parametrize("answered, apart", [(1, False), (9, False), (10, True), (12, True)])
def test_a_difference_of_rmses_on_fewer_than_ten_answers_is_never_called_apart(answered, apart):
    """A is off by 1 on every number it gives, B by 3: clear wherever both answer enough. On one answer each the
    bootstrap interval has no width at all (+2 and +2), which must not read as a difference the samples show."""
    esol = "property_prediction-esol"

    def records(error: float) -> list[dict]:
        return [{"task": esol, "index": i, "input": f"q{i}", "gold": "0.0",
                 "predictions": [f"<NUMBER> {error} </NUMBER>" if i < answered else "no idea"]} for i in range(12)]

    result = paired_difference(records(1.0), records(3.0), {esol: "rmse"}, 500)[esol]
    assert result["difference"] == pytest.approx(-2.0) and result["interval"] == pytest.approx([-2.0, -2.0])
    assert result["excludes_zero"] is apart and result["samples"] == 12
