"""objective=grpo end to end: the tiny model samples, the scorer rewards, the adapters learn, a run resumes exactly."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from grpo_probe import CRAFTED
from refusals import refused

from llasmol.core.config import check_overrides
from llasmol.core.schema import check_config
from llasmol.metrics.extract import extract_answer
from llasmol.metrics.scoring import sample_stats
from llasmol.train import train

# Two tasks of two families, 2 prompts of 3 completions a step, no validation but the last step's.
GRPO = ["objective=grpo", "data.tasks=[forward_synthesis,property_prediction-esol]", "data.micro_batch_size=2",
        "data.effective_batch_size=2", "objective.num_generations=3", "objective.max_new_tokens=8",
        "val_every_n_steps=100", "callbacks.generation_evaluator.samples_per_task=1",
        "generation.max_new_tokens_limit=8", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
        "checkpoint_every_n_steps=1"]
@pytest.fixture
def crafted(monkeypatch):
    """The sampler with crafted answers (`grpo_probe.CRAFTED`) in this process."""
    from grpo_probe import crafted_sampler

    from llasmol.core.config import compose_config
    from llasmol.finetune import rollouts
    from llasmol.model.base import load_tokenizer

    sample = crafted_sampler(load_tokenizer(compose_config(["paths.output_dir=/unused"]).model))
    monkeypatch.setattr(rollouts, "sample_group", sample)
    return sample


def _size(smiles: str) -> int:
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    return mol.GetNumHeavyAtoms() if mol is not None else 0


def _rollouts(run: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts" / f"step{step}.jsonl").read_text().splitlines()]


def _logged(run: Path) -> dict[int, dict[str, float]]:
    """step -> the values logged in optimizer step `step` (csv/metrics.csv numbers rows by the steps done)."""
    rows: dict[int, dict[str, float]] = {}
    with (run / "csv" / "metrics.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            rows.setdefault(int(row["step"]), {}).update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return rows


def test_each_completion_is_rewarded_by_the_scorers_own_statistics_and_logged(cfg_factory, tmp_path, crafted):
    cfg = cfg_factory(*GRPO, "trainer.max_steps=2")
    result = train(cfg)
    assert result["global_step"] == 2
    logged = _logged(tmp_path)
    weights = cfg.reward.families
    tasks = check_config(cfg).tasks
    from llasmol.inference.pipeline import split_golds
    from llasmol.data.datamodule import SMolInstructDataModule
    from llasmol.model.base import load_tokenizer
    import hydra

    dm: SMolInstructDataModule = hydra.utils.instantiate(cfg.data, tokenizer=load_tokenizer(cfg.model),
                                                         _convert_="all", table=tasks)
    split = dm.split("train")
    golds = split_golds(split)
    for step in (1, 2):
        records = _rollouts(tmp_path, step)
        assert len(records) == 2 * 3 and [r["completion"] for r in records[:2]] == list(CRAFTED)
        # Clipped: cut at the bound (8 tokens) before an end; the crafted molecule ends well before it.
        assert not records[0]["clipped"] and records[0]["tokens"] < 8
        assert all(r["tokens"] == 8 for r in records if r["clipped"]) and any(r["clipped"] for r in records)
        for record in records:
            sample = split[record["index"]]
            assert record["task"] == sample["task"]
            stats = sample_stats(sample["task"], [record["completion"]], golds.golds(sample, sample["raw_output"]),
                                 tasks=tasks)
            # Paid only when it ended with its answer in the task's tags once (the crafted ones, not the noise)
            tag = "SMILES" if sample["task"] == "forward_synthesis" else "NUMBER"
            text = record["completion"]
            formed = float(not record["clipped"] and text.count(f"<{tag}>") == 1 and text.count(f"</{tag}>") == 1
                           and 1 - stats["num_no_answer"])
            if sample["task"] == "forward_synthesis":
                size = _size(text.split()[1]) if formed and stats["num_valid"] else 0
                gold_size = max(_size(g) for g in golds.golds(sample, sample["raw_output"]))
                terms = {"format": formed, "validity": min(size, gold_size) / max(size, gold_size) if size else 0.0,
                         "similarity": formed * stats["fts_morgan_sum"], "exact": formed * stats["hit_top1"]}
                family = weights.smiles
            else:
                value = float(sample["raw_output"])
                number = float(text.split()[1]) if formed and stats["num_valid"] else None
                terms = {"format": formed, "validity": formed * stats["num_valid"],
                         "error": 1 / (1 + abs(number - value)) if number is not None else 0.0}
                family = weights.number
            assert record["terms"] == pytest.approx(terms)
            assert record["reward"] == pytest.approx(sum(family[t] * v for t, v in terms.items()))
        rewards = np.array([r["reward"] for r in records])
        assert rewards.max() > 0 and not math.isclose(rewards.min(), rewards.max())
        groups = rewards.reshape(2, 3)
        advantages = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True) + 1e-4)
        assert [r["advantage"] for r in records] == pytest.approx(advantages.ravel().tolist(), abs=1e-5)
        row = logged[step]
        assert row["train/reward"] == pytest.approx(rewards.mean(), rel=1e-5)
        assert row["train/no_signal"] == pytest.approx(np.mean([math.isclose(g.std(), 0) for g in groups for _ in g]))
        # What reveals an exploit, counted here from the rollouts as a user would count them
        ended = [not r["clipped"] for r in records]
        assert row["train/completion_ended"] == pytest.approx(np.mean(ended), abs=1e-7)
        assert row["train/completion_clipped"] == pytest.approx(1 - np.mean(ended), abs=1e-7)
        answers = [[extract_answer(r["task"], r["completion"]) for r in records[g * 3:(g + 1) * 3]] for g in range(2)]
        shares = [max([a.count(x) for x in a if x is not None], default=0) / 3 for a in answers]
        distinct = [len({x for x in a if x is not None}) for a in answers]
        assert row["train/collapse/top_answer_share"] == pytest.approx(np.mean(shares), abs=1e-7)
        assert row["train/collapse/distinct_answers"] == pytest.approx(np.mean(distinct), abs=1e-7)
        assert 0 < row["train/entropy"] <= math.log(2062)  # at most the uniform distribution's (the tokenizer's size)
        assert row["train/resampled_groups"] == 0 and row["train/left_out"] == 0  # dynamic_sampling=none
        for task in {r["task"] for r in records}:
            mine = [r for r in records if r["task"] == task]
            assert row[f"train/reward/{task}"] == pytest.approx(np.mean([r["reward"] for r in mine]), rel=1e-5)
            for term in mine[0]["terms"]:
                assert row[f"train/reward/{task}/{term}"] == pytest.approx(np.mean([r["terms"][term] for r in mine]),
                                                                           rel=1e-5, abs=1e-7)
        assert {"train/loss", "train/clip_ratio/region", "train/completion_length", "train/rollout_tokens_per_sec",
                "train/reward_std"} <= set(row)
    assert "val/loss" in result["metrics"]  # the validation the SFT stage had, at the last step


def test_each_completion_stops_at_its_own_tasks_bound_within_one_batch(cfg_factory, tmp_path):
    """Generation bounds a task's answers by its max_new_tokens (under generation.max_new_tokens_limit and
    objective.max_new_tokens): one generate call serves the batch, each completion is cut at its task's."""
    train(cfg_factory(*GRPO, "trainer.max_steps=2", "+generation.tasks.forward_synthesis.max_new_tokens=2"))
    records = [r for step in (1, 2) for r in _rollouts(tmp_path, step)]
    bound = {"forward_synthesis": 2, "property_prediction-esol": 8}
    assert {r["task"] for r in records} == set(bound)
    assert all(1 <= r["tokens"] <= bound[r["task"]] for r in records)
    assert max(r["tokens"] for r in records if r["task"] == "property_prediction-esol") > 2


def _steps(run: Path, steps) -> list[list[tuple]]:
    return [[(r["index"], r["completion"], round(r["reward"], 6), r["reused"]) for r in _rollouts(run, s)]
            for s in steps]


@pytest.mark.parametrize("iterations, beta, signum", [(1, 0, 2), (2, 0, 2), (1, 0.5, 2), (2, 0.5, 15)])
def test_a_stage_resumed_from_its_checkpoint_samples_rewards_and_learns_as_the_uninterrupted_one(
        cfg_factory, tmp_path, crafted, iterations, beta, signum):
    """Rollouts are drawn from (seed, epoch, batch, rank), the data position and a kept rollout
    (num_iterations=2: step 2 trains on step 1's rollout again) travel in the checkpoint, and the KL's reference
    stays the adapters the stage started from (not the resumed ones)."""
    settings = [*GRPO, f"objective.num_iterations={iterations}", "lora.dropout=0", f"objective.beta={beta}",
                "scheduler.num_warmup_steps=0", "optimizer.lr=0.01"]
    whole = train(cfg_factory(*settings, "trainer.max_steps=3", f"paths.output_dir={tmp_path / 'whole'}"))
    with pytest.raises(SystemExit):  # Ctrl-C (SIGTERM: a cluster) in step 1: it stops at its end (interrupted.ckpt)
        train(cfg_factory(*settings, "trainer.max_steps=3", f"paths.output_dir={tmp_path / 'cut'}",
                          f"+callbacks.signal={{_target_:test_resume.SignalAtStep,step:1,signum:{signum}}}"))
    resumed = train(cfg_factory(*settings, "trainer.max_steps=3", f"paths.output_dir={tmp_path / 'cut'}",
                                "ckpt_path=last"))
    assert resumed["resumed_from"] and resumed["global_step"] == whole["global_step"] == 3
    assert _steps(tmp_path / "cut", (2, 3)) == _steps(tmp_path / "whole", (2, 3))
    reused = [r[3] for step in _steps(tmp_path / "whole", (1, 2, 3)) for r in step]
    assert reused == [False] * 6 + [iterations == 2] * 6 + [False] * 6
    if iterations == 2:  # the kept rollout: step 2's completions are step 1's
        assert [r[:3] for r in _steps(tmp_path / "whole", (2,))[0]] == [r[:3] for r in _steps(tmp_path / "whole", (1,))[0]]
    cut, full = _logged(tmp_path / "cut"), _logged(tmp_path / "whole")
    for step in (2, 3):
        assert cut[step]["train/loss"] == pytest.approx(full[step]["train/loss"], abs=1e-6)
        assert cut[step]["train/lr"] == pytest.approx(full[step]["train/lr"])
        if beta:
            assert full[step]["train/kl"] > 1e-7
            assert cut[step]["train/kl"] == pytest.approx(full[step]["train/kl"], rel=1e-4)
    import torch

    ends = [torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
            for run in (tmp_path / "whole", tmp_path / "cut")]
    assert ends[0].keys() == ends[1].keys() and all(torch.allclose(ends[0][k], ends[1][k], atol=1e-6) for k in ends[0])
    assert any(float(v.abs().sum()) > 0 for k, v in ends[0].items() if "lora_B" in k)  # it learnt something


def test_the_kl_to_the_starting_adapters_is_zero_at_the_start_and_the_stage_starts_from_init_from(
        cfg_factory, tmp_path, trained_run, crafted):
    from llasmol.model.adapters import adapter_weights
    from llasmol.inference.loading import starting_adapter

    cfg = cfg_factory(*GRPO, "lora=lite", "lora.dropout=0", f"init_from={trained_run}", "objective.beta=0.5", "trainer.max_steps=2",
                      "optimizer.lr=0.05", "scheduler.num_warmup_steps=0")
    folder = starting_adapter(cfg)
    start, _ = adapter_weights(folder)
    train(cfg)
    logged = _logged(tmp_path)
    assert logged[1]["train/kl"] == pytest.approx(0.0, abs=1e-7)  # the policy is its reference before any update
    assert logged[2]["train/kl"] > 1e-6  # the first update moved it
    objective = json.loads((tmp_path / "card.json").read_text())["objective"]  # every card of the run says it
    assert objective.startswith("GRPO (loss dapo, 3 completions") and "beta 0.5" in objective and "from run" in objective
    # The trained adapter moved away from where it started, which was the run's own (not a fresh B = 0).
    assert any(float(t.abs().sum()) > 0 for k, t in start.items() if "lora_B" in k)


@pytest.mark.parametrize("overrides, named", [
    (["objective=grpo", "objective.num_generations=1"], ["objective.num_generations=1", ">= 2"]),
    (["objective=grpo", "data.packing=true"], ["data.packing=true", "objective=sft"]),
    (["objective.beta=0.1"], ["objective.beta", "objective=grpo"]),
    (["reward.families.smiles.exact=2"], ["reward.families.smiles.exact", "objective=grpo"]),
    (["objective=grpo", "objective.loss_type=ppo"], ["objective.loss_type='ppo'", "dapo"]),
    (["objective=grpo", "reward.families.smiles.exactt=1"], ["reward.families.smiles.exactt"]),
    (["objective=grpo", "+reward.families.smiles.exactness=1"], ["reward.families.smiles", "exactness", "exact"]),
    (["objective=grpo", "data.tasks=[forward_synthesis]", "reward.families.smiles.format=0",
      "reward.families.smiles.validity=0", "reward.families.smiles.similarity=0", "reward.families.smiles.exact=0"],
     ["forward_synthesis", "is 0"]),
    (["objective=grpo", "+reward.tasks.forward_synthesi.exact=1"], ["reward.tasks.forward_synthesi"]),
    (["objective=grpo", "init_from=/nowhere/run"], ["init_from=/nowhere/run"]),
    (["objective=grpo", "callbacks.generation_evaluator.samples_per_task=0"],
     ["callbacks.generation_evaluator.samples_per_task=0", "val/reward", "callbacks.model_checkpoint.monitor=val/loss"]),
    (["objective=grpo", "data.tasks=[forward_synthesis]", "+reward.families.number.errr=1"],
     ["reward.families.number.errr", "format, validity, error"]),  # a family this run does not train
])
def test_a_bad_grpo_setting_is_one_line_before_hydra_starts(overrides, named):
    with refused(*named):
        from llasmol.metrics.rewards import check_rewards

        check_overrides("train", overrides, check_rewards)
        from llasmol.core.config import compose_config
        from llasmol.inference.loading import starting_adapter

        starting_adapter(compose_config(["paths.output_dir=/unused", *overrides]))


def test_init_from_a_run_of_another_variant_or_base_is_refused_before_the_base_loads(cfg_factory, trained_run, tmp_path):
    from llasmol.inference.loading import starting_adapter

    with refused(f"init_from={trained_run}", "lora=full", "rank"):
        starting_adapter(cfg_factory("objective=grpo", f"init_from={trained_run}", "lora=full"))
    other = tmp_path / "other"
    shutil.copytree(trained_run, other)
    config = (other / ".hydra" / "config.yaml").read_text().replace("name: tiny", "name: tiny2", 1)
    (other / ".hydra" / "config.yaml").write_text(config)
    with refused(f"init_from={other}", "model=tiny2"):
        starting_adapter(cfg_factory("objective=grpo", f"init_from={other}", "lora=lite"))


def test_report_draws_a_grpo_runs_reward_curves_beside_its_losses_and_metrics(cfg_factory, tmp_path, crafted):
    from llasmol.analysis import plots
    from llasmol.analysis.runs import load_run
    from llasmol.analysis.tables import metric_trends

    train(cfg_factory(*GRPO, "trainer.max_steps=2", "val_every_n_steps=1"))
    run = load_run(tmp_path)
    curves = run.reward_curves()
    # The overall and per-task means of every step, as each step's rollouts file holds them (no term curves).
    assert set(curves) == {"train/reward"} | {f"train/reward/{r['task']}" for s in (1, 2) for r in _rollouts(tmp_path, s)}
    assert curves["train/reward"] == [(s, pytest.approx(np.mean([r["reward"] for r in _rollouts(tmp_path, s)]), rel=1e-5))
                                      for s in (1, 2)]
    figure = plots.plot_trends(metric_trends(run), losses=run.loss_curves(), rewards=curves)
    panels = {ax.get_ylabel(): {line.get_label() for line in ax.get_lines()} for ax in figure.axes}
    assert panels["mean reward (GRPO)"] == set(curves)
    assert "train/loss" in panels["loss (nats/token)"] and not panels["loss (nats/token)"] & set(curves)


@pytest.mark.slow
def test_grpo_under_fsdp2_samples_rewards_and_learns_as_under_ddp_on_two_processes(tmp_path):
    """Each rank samples its own prompts (its seed has its rank), the sharded model generates in lockstep, the
    KL's reference is each rank's copy of its shards; rank 0 writes every rank's completions. Each rank crafts
    answers into its groups (`grpo_probe.CraftedRollouts`): a random base earns no reward, and with no advantage
    and the policy at its reference (where the KL's gradient is zero) nothing would move."""
    from test_multiprocess import FSDP, _train

    settings = [*GRPO, "trainer.max_steps=2", "trainer.accelerator=cpu", "trainer.devices=2", "logger=csv",
                "data.effective_batch_size=4", "objective.beta=0.5", "lora.dropout=0", "scheduler.num_warmup_steps=0",
                "optimizer.lr=0.01", "+callbacks.crafted._target_=grpo_probe.CraftedRollouts"]
    runs = {}
    for kind, extra in (("ddp", ["trainer=ddp"]), ("fsdp", FSDP)):
        proc = _train(tmp_path / kind, [*settings, *extra], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[kind] = tmp_path / kind
    for step in (1, 2):
        ddp, fsdp = _rollouts(runs["ddp"], step), _rollouts(runs["fsdp"], step)
        assert len(ddp) == 2 * 2 * 3  # two ranks' prompts, 3 completions each
        assert [(r["index"], r["completion"], r["reward"]) for r in fsdp] == [(r["index"], r["completion"], r["reward"])
                                                                             for r in ddp]
        assert len({r["index"] for r in ddp}) == 4  # each rank its own prompts
        assert sum(r["completion"] in CRAFTED for r in ddp) == 2 * 2 * 2 and len({r["reward"] for r in ddp}) > 1
    logged = {kind: _logged(run) for kind, run in runs.items()}
    for step in (1, 2):
        # The step's rewards are of both ranks' completions (rank 0 logs, every rank computes them alike).
        assert logged["ddp"][step]["train/reward"] == pytest.approx(
            np.mean([r["reward"] for r in _rollouts(runs["ddp"], step)]), rel=1e-6)
        for key in ("train/loss", "train/kl"):
            assert logged["fsdp"][step][key] == pytest.approx(logged["ddp"][step][key], rel=1e-4, abs=1e-7)
    assert logged["ddp"][2]["train/kl"] > 1e-7


@pytest.mark.slow
def test_wandb_holds_every_grpo_series_the_csv_log_holds_at_the_same_steps(cfg_factory, tmp_path, crafted,
                                                                             monkeypatch):
    from test_tracking import wandb_history, wandb_run_files

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by our config, not by the environment
    train(cfg_factory(*GRPO, "trainer.max_steps=2", "logger=[csv,wandb]", "objective.beta=0.1"))
    (record,) = wandb_run_files(tmp_path)
    history = wandb_history(record)
    logged = _logged(tmp_path)
    prefixes = ("train/reward", "train/kl", "train/clip", "train/completion", "train/no_signal", "train/rollout")
    for step in (1, 2):
        # A task whose prompts a step did not draw has no reward series at that step, in either log.
        grpo_keys = {k for k in logged[step] if k.startswith(prefixes)}
        assert {"train/reward", "train/reward_std", "train/no_signal", "train/kl", "train/completion_length",
                "train/completion_clipped", "train/rollout_tokens_per_sec", "train/clip_ratio/region",
                "train/reward/forward_synthesis/format"} <= grpo_keys
        (row,) = [row for row in history if row.get("trainer/global_step") == step and "train/reward" in row]
        assert {k for k in row if k.startswith(prefixes)} == grpo_keys
        for key in grpo_keys:
            assert row[key] == pytest.approx(logged[step][key], rel=1e-6), key


@pytest.fixture
def crafted_validation(monkeypatch):
    """Validation answers set by the step: at step 1 every sample's top answer is its gold between its tags, at
    step 2 only the even-numbered samples' (the others answer nothing)."""
    from llasmol.finetune import validation
    from llasmol.inference.pipeline import ModelAnswers

    tags = {"forward_synthesis": "SMILES", "property_prediction-esol": "NUMBER"}

    class Crafted(ModelAnswers):
        step = 0

        def answer(self, samples, advance=None):
            Crafted.step += 1
            records = super().answer(samples, advance)
            for record in records:
                right = Crafted.step == 1 or record["index"] % 2 == 0
                tag = tags[record["task"]]
                record["predictions"] = [f"<{tag}> {record['gold'][0]} </{tag}>" if right else "",
                                         *record["predictions"][1:]]
                record["ended"] = [True, *record["ended"][1:]]  # the crafted answer ended within its bound
            return records

    monkeypatch.setattr(validation, "ModelAnswers", Crafted)


def test_validation_rewards_the_top_answers_and_the_best_checkpoint_is_the_highest_val_reward(
        cfg_factory, tmp_path, crafted_validation, caplog):
    from llasmol.inference.loading import _best_adapter

    cfg = cfg_factory(*GRPO, "trainer.max_steps=2", "val_every_n_steps=1",
                      "callbacks.generation_evaluator.samples_per_task=3")
    with caplog.at_level("INFO", logger="llasmol.train"):
        result = train(cfg)
    said = caplog.text
    logged = _logged(tmp_path)
    right = {"forward_synthesis": 0.1 + 0.2 + 0.3 + 1.0, "property_prediction-esol": 0.1 + 0.2 + 1.0}  # the gold
    for step in (1, 2):
        records = [json.loads(line) for line in (tmp_path / "predictions" / f"val-step{step}.jsonl").read_text()
                   .splitlines()]
        by_task = {task: [right[task] if step == 1 or r["index"] % 2 == 0 else 0.0 for r in records
                          if r["task"] == task] for task in right}
        assert all(len(v) == 3 for v in by_task.values())
        for task, values in by_task.items():
            assert logged[step][f"val/reward/{task}"] == pytest.approx(np.mean(values), rel=1e-6)
        assert logged[step]["val/reward"] == pytest.approx(np.mean([v for vs in by_task.values() for v in vs]),
                                                           rel=1e-6)
    assert logged[2]["val/reward"] < logged[1]["val/reward"]
    # Kept by val/reward, the highest (step 1), whatever val/loss says; evaluate and init_from take that one.
    assert result["best_by"] == "val/reward"
    assert Path(result["best_checkpoint"]).name == f"step1-val_reward{logged[1]['val/reward']:.4f}.ckpt"
    with caplog.at_level("INFO"):
        adapter = _best_adapter(tmp_path)  # what ckpt=<run> and init_from=<run> read
    assert adapter.name == f"step1-val_reward{logged[1]['val/reward']:.4f}.adapter"
    assert "(the best by val/reward;" in caplog.text
    assert f"val/reward {logged[1]['val/reward']:.4f}" in said  # each validation's line in train.log
    assert f"(val/reward {logged[1]['val/reward']:.4f}). Next:" in said  # and the closing one


@pytest.mark.parametrize("overrides", [
    ["callbacks.generation_evaluator.samples_per_task=0"],  # SFT: no generation at validation is allowed
    ["objective=grpo", "callbacks.generation_evaluator.samples_per_task=0", "callbacks.model_checkpoint.monitor=val/loss",
     "callbacks.model_checkpoint.mode=min"],  # GRPO choosing by loss needs no answers either
    ["objective=grpo", "callbacks.generation_evaluator.samples_per_task=1"],
])
def test_no_generation_at_validation_is_allowed_where_nothing_is_chosen_by_it(overrides):
    from llasmol.core.config import compose_config

    check_config(compose_config([*overrides, "paths.output_dir=/x"]))


def test_grpo_keeps_its_best_checkpoint_by_val_reward_unless_the_command_line_says_otherwise():
    from llasmol.core.config import compose_config

    def chosen(*overrides):
        cfg = compose_config([*overrides, "paths.output_dir=/x"])
        checkpoint, evaluator = cfg.callbacks.model_checkpoint, cfg.callbacks.generation_evaluator
        return checkpoint.monitor, checkpoint.mode, evaluator.samples_per_task, "rewards" in evaluator

    assert chosen() == ("val/loss", "min", 4, False)  # SFT as before: no reward at validation, the demo's 4 samples
    # GRPO: by val/reward, on 32 samples a task; its rewards are handed over as one object, not copied into config
    assert chosen("objective=grpo", "reward.families.smiles.exact=2") == ("val/reward", "max", 32, False)
    assert chosen("objective=grpo", "callbacks.model_checkpoint.monitor=val/loss",
                  "callbacks.model_checkpoint.mode=min")[:2] == ("val/loss", "min")


def test_one_rewards_object_is_built_per_run_and_serves_its_rollouts_and_its_validation(cfg_factory, monkeypatch):
    """A `train` command checks its command line before Hydra and runs inside it: one object all the way."""
    from llasmol.finetune import build
    from llasmol.train import _check_rewards
    from llasmol.finetune.validation import GenerationEvaluator
    from llasmol.metrics import rewards as rewards_module

    built, handed = [], {}
    real_init = rewards_module.Rewards.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(rewards_module.Rewards, "__init__", counted)
    monkeypatch.setattr(rewards_module, "_BUILT", [])  # as a fresh process starts
    real_trainer = build.build_trainer

    def spy(cfg, datamodule, resume, rewards=None):
        trainer = real_trainer(cfg, datamodule, resume, rewards)
        handed["evaluator"] = next(c.rewards for c in trainer.callbacks if isinstance(c, GenerationEvaluator))
        return trainer

    monkeypatch.setattr("llasmol.finetune.fit.build_trainer", spy)
    module_rewards = []
    real_module = build.build_module
    monkeypatch.setattr("llasmol.finetune.fit.build_module",
                        lambda *a, **k: module_rewards.append(m := real_module(*a, **k)) or m)
    overrides = [*GRPO, "trainer.max_steps=1", "reward.families.smiles.exact=2"]
    check_overrides("train", [*overrides, "logger=csv"], _check_rewards)  # the command line's check, before Hydra
    assert len(built) == 1
    train(cfg_factory(*overrides))
    assert len(built) == 1 and handed["evaluator"] is built[0] is module_rewards[0].rewards
    assert built[0].weights["forward_synthesis"]["exact"] == 2.0  # the command line's weight reached both
    check_overrides("train", [*GRPO, "reward.families.smiles.exact=3"], _check_rewards)
    assert len(built) == 2 and built[1].weights["forward_synthesis"]["exact"] == 3.0  # other weights: built anew


@pytest.mark.slow
def test_a_multirun_sweeps_a_grpo_setting_as_any_other(tmp_path):
    """`--multirun objective.beta=0,0.2`: two jobs, each its own rollouts and log; the KL only where beta > 0."""
    import os
    import subprocess
    import sys

    from conftest import HANG_TIMEOUT

    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "llasmol.train", "--multirun", "objective.beta=0,0.2",
                           f"hydra.sweep.dir={sweep}", "logger=csv", *GRPO, "trainer.max_steps=1"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name.split("_")[0] for p in jobs] == ["0", "1"]
    for job, beta in zip(jobs, (0, 0.2)):
        assert "objective.beta" in (job / ".hydra" / "overrides.yaml").read_text()
        assert len(_rollouts(job, 1)) == 2 * 3
        assert ("train/kl" in _logged(job)[1]) == (beta > 0)


def test_a_steps_logged_rewards_are_of_all_its_micro_batches_and_only_of_the_tasks_it_drew(cfg_factory, tmp_path,
                                                                                          crafted):
    """Two micro-batches a step: every series is of the step's 12 completions, not of its last micro-batch; a task
    the step drew no prompt of has no value in the step's row (Lightning would repeat its last one)."""
    train(cfg_factory(*GRPO, "trainer.max_steps=4", "data.effective_batch_size=4"))
    logged = _logged(tmp_path)
    seen_before: set[str] = set()
    absent_after_seen = 0
    for step in (1, 2, 3, 4):
        records, row = _rollouts(tmp_path, step), logged[step]
        assert len(records) == 2 * 2 * 3
        rewards = np.array([r["reward"] for r in records])
        groups = rewards.reshape(-1, 3)
        assert row["train/reward"] == pytest.approx(rewards.mean(), rel=1e-6)
        assert row["train/reward_std"] == pytest.approx(groups.std(axis=1, ddof=1).mean(), rel=1e-6, abs=1e-9)
        assert row["train/no_signal"] == pytest.approx(np.mean([g.max() == g.min() for g in groups]))
        assert row["train/completion_length"] == pytest.approx(np.mean([r["tokens"] for r in records]))
        assert row["train/completion_clipped"] == pytest.approx(np.mean([r["clipped"] for r in records]))
        assert row["train/rollout_tokens_per_sec"] > 0
        tasks = {r["task"] for r in records}
        assert {k.split("/")[2] for k in row if k.startswith("train/reward/")} == tasks
        for task in tasks:
            mine = [i for i, r in enumerate(records) if r["task"] == task]
            assert row[f"train/reward/{task}"] == pytest.approx(rewards[mine].mean(), rel=1e-6)
            assert row[f"train/reward/{task}/std"] == pytest.approx(
                groups[sorted({i // 3 for i in mine})].std(axis=1, ddof=1).mean(), rel=1e-6, abs=1e-9)
        absent_after_seen += len(seen_before - tasks)
        seen_before |= tasks
    assert absent_after_seen > 0  # the case this test is for happened


def test_a_stage_with_a_kl_term_resumes_only_from_the_adapters_it_started_from(cfg_factory, tmp_path, trained_run):
    """The reference is copied as the process starts: resuming without the stage's init_from would pull it towards
    fresh adapters. Refused in one line naming the init_from to give; with it, the stage goes on."""
    from llasmol.inference.loading import starting_adapter

    settings = [*GRPO, "lora=lite", f"init_from={trained_run}", "objective.beta=0.5", "trainer.max_steps=2"]
    folder = starting_adapter(cfg_factory(*settings))
    with pytest.raises(SystemExit):  # Ctrl-C in step 1: interrupted.ckpt
        train(cfg_factory(*settings, "+callbacks.signal={_target_:test_resume.SignalAtStep,step:1}"))
    without = [o for o in settings if not o.startswith("init_from=")]
    with refused(f"init_from={folder}", "fresh adapters", "objective.beta=0.5"):
        train(cfg_factory(*without, "ckpt_path=last"))
    assert train(cfg_factory(*settings, "ckpt_path=last"))["global_step"] == 2
