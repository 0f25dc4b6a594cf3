"""The GRPO stage's defences against a reward it can exploit, end to end on the tiny model with crafted rollouts:
dynamic sampling (skip, refill), truncated completions left out of the loss, DAPO's soft overlong punishment, `dapo`
divided by the whole step's tokens, a validation that pays no beam that never ended, a tie that keeps the later
checkpoint, and train.log naming the metric the checkpoint is chosen by."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import SEED
from grpo_probe import CRAFTED
from test_grpo_train import _logged, _rollouts

from llasmol.metrics.rewards import overlong_penalty
from llasmol.train import train

# One task, 2 prompts of 4 completions a micro-batch, no validation but the last step's.
GRPO = ["objective=grpo", "data.tasks=[forward_synthesis]", "data.micro_batch_size=2", "data.effective_batch_size=2",
        "objective.num_generations=4", "objective.max_new_tokens=8", "val_every_n_steps=100",
        "callbacks.generation_evaluator.samples_per_task=1", "generation.max_new_tokens_limit=8",
        "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "model.random_init=true"]


@pytest.fixture
def crafted(monkeypatch):
    """The sampler with crafted answers (`grpo_probe.CRAFTED`: the first completion of each group a molecule in its
    tags, the second a number) in this process; the rest are the random tiny model's noise."""
    from grpo_probe import crafted_sampler

    from llasmol.core.config import compose_config
    from llasmol.finetune import rollouts
    from llasmol.model.base import load_tokenizer

    monkeypatch.setattr(rollouts, "sample_group", crafted_sampler(load_tokenizer(compose_config(
        ["paths.output_dir=/unused"]).model)))


@pytest.fixture
def captured(monkeypatch):
    """Every rollout the module trains on, as it trains on it (its rows, masks, advantages and records)."""
    from llasmol.finetune import rollouts

    seen = []
    real = rollouts.GRPOLoRA._roll_out

    def spy(self, batch, batch_idx):
        rollout = real(self, batch, batch_idx)
        seen.append(rollout)
        return rollout

    monkeypatch.setattr(rollouts.GRPOLoRA, "_roll_out", spy)
    return seen


def _groups(records: list[dict], size: int = 4) -> list[list[dict]]:
    return [records[i:i + size] for i in range(0, len(records), size)]


def test_skip_leaves_the_groups_that_teach_nothing_out_of_the_loss(cfg_factory, tmp_path, monkeypatch, captured):
    """Every completion of a group the same: crafted here for every second group (its 4 completions one molecule)."""
    from grpo_probe import crafted_sampler

    from llasmol.finetune import grpo, rollouts
    from llasmol.model.base import load_tokenizer

    tokenizer = load_tokenizer(cfg_factory(*GRPO).model)
    base = crafted_sampler(tokenizer)

    def sample(model, ids, mask, generations, limit, *args, **kwargs):
        completion, _ = base(model, ids, mask, generations, limit, *args, **kwargs)
        eos = args[3]
        same = tokenizer(CRAFTED[0], add_special_tokens=False).input_ids + [eos]
        for row in range(generations, 2 * generations):  # the second prompt's group: all the same answer
            completion[row] = eos
            completion[row, :len(same)] = torch.tensor(same[:completion.size(1)])
        return completion, grpo.completion_mask(completion, eos)

    monkeypatch.setattr(rollouts, "sample_group", sample)
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "objective.dynamic_sampling=skip"))
    records = _rollouts(tmp_path, 1)
    first, second = _groups(records)
    assert len({r["reward"] for r in second}) == 1 and len({r["reward"] for r in first}) > 1
    assert [r["kept"] for r in records] == [True] * 4 + [False] * 4
    (rollout,) = captured
    assert rollout.completion_mask[4:].sum() == 0 and rollout.completion_mask[:4].sum() > 0  # out of the loss
    row = _logged(tmp_path)[1]
    assert row["train/no_signal"] == 0.5 and row["train/left_out"] == 0.5 and row["train/resampled_groups"] == 0


def test_refill_samples_further_prompts_for_the_groups_that_teach_nothing_up_to_its_bound(cfg_factory, tmp_path,
                                                                                          captured, monkeypatch):
    """The random tiny model's noise earns 0 everywhere: every group teaches nothing, and every refill round does
    no better, so `max_resamples` rounds are sampled and the slots stay out of the loss."""
    from llasmol.finetune import rollouts

    seeds, real = [], rollouts.sample_group

    def spy(*args, **kwargs):
        seeds.append(args[7])  # (model, ids, mask, generations, limit, temperature, top_p, seed, ...)
        return real(*args, **kwargs)

    monkeypatch.setattr(rollouts, "sample_group", spy)
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "objective.dynamic_sampling=refill", "objective.max_resamples=2"))
    assert len(seeds) == 3 == len(set(seeds))  # each round samples from its own seed
    records = _rollouts(tmp_path, 1)
    assert [r["round"] for r in records] == [0] * 8 + [1] * 8 + [2] * 8  # 2 prompts a round, 4 completions each
    assert all(r["reward"] == 0 for r in records) and not any(r["kept"] for r in records)
    # The further prompts: drawn from the training split by the step's place and the round, nothing else
    import numpy as np

    from llasmol.finetune.rollouts import REFILL_SEED

    for round_ in (1, 2):
        drawn = np.random.default_rng([SEED, 0, 0, 0, REFILL_SEED, round_]).choice(300, size=2, replace=False)
        assert [r["index"] for r in records if r["round"] == round_] == [int(i) for i in drawn for _ in range(4)]
    (rollout,) = captured
    assert rollout.completion_mask.sum() == 0  # nothing to learn from: every process still steps
    row = _logged(tmp_path)[1]
    assert row["train/no_signal"] == 1.0 and row["train/resampled_groups"] == 4 and row["train/left_out"] == 1.0
    assert row["train/reward"] == 0  # of the step's own prompts (round 0) only


def test_a_refilled_group_that_teaches_takes_the_empty_slot_and_is_trained_on(cfg_factory, tmp_path, crafted,
                                                                              captured, monkeypatch):
    """Round 0's second prompt gets noise alone (nothing to learn); the refill round's prompts get the crafted
    answers, so the first refilled group takes that slot."""
    from llasmol.finetune import rollouts

    real = rollouts.GRPOLoRA._sample

    def sample(self, batch, batch_idx, round_):
        part = real(self, batch, batch_idx, round_)
        if round_ == 0:  # the second group earns the same everywhere: all its completions made to earn 0
            for record in part["records"][4:]:
                record["reward"] = 0.0
            part["rewards"][1] = 0.0
        return part

    monkeypatch.setattr(rollouts.GRPOLoRA, "_sample", sample)
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "objective.dynamic_sampling=refill", "objective.max_resamples=3"))
    records = _rollouts(tmp_path, 1)
    assert [r["round"] for r in records][:10] == [0] * 8 + [1] * 2  # one round was enough
    assert len(records) == 12 and {r["round"] for r in records} == {0, 1}
    kept = [r for r in records if r["kept"]]
    assert [r["round"] for r in kept] == [0] * 4 + [1] * 4  # the first group, then the refilled one in its slot
    (rollout,) = captured
    assert rollout.completion_mask[4:].sum() > 0  # the refilled group is trained on
    assert [r["advantage"] for r in records if not r["kept"]] == [0.0] * 4
    row = _logged(tmp_path)[1]
    assert row["train/resampled_groups"] == 1 and row["train/left_out"] == 0 and row["train/no_signal"] == 0.5


def test_truncated_completions_are_left_out_of_the_loss_when_asked(cfg_factory, tmp_path, crafted, captured):
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "objective.mask_truncated_completions=true"))
    records = _rollouts(tmp_path, 1)
    (rollout,) = captured
    clipped = [r["clipped"] for r in records]
    assert any(clipped) and not all(clipped)
    for row, cut in enumerate(clipped):
        assert (rollout.completion_mask[row].sum() == 0) == cut, row


def test_the_soft_overlong_punishment_is_added_to_each_completions_reward(cfg_factory, tmp_path, crafted):
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "objective.soft_punish_cache=3"))
    for record in _rollouts(tmp_path, 1):
        assert record["terms"]["overlong"] == overlong_penalty(record["tokens"], 8, 3)
        built_in = sum(w * record["terms"][t] for t, w in {"format": 0.1, "validity": 0.2, "similarity": 0.3,
                                                            "exact": 1.0}.items())
        assert record["reward"] == pytest.approx(built_in + record["terms"]["overlong"])
    assert any(r["terms"]["overlong"] == -1.0 for r in _rollouts(tmp_path, 1))  # the noise runs to its bound


def test_dapo_divides_the_steps_gradients_by_all_its_completion_tokens(cfg_factory, tmp_path, crafted, monkeypatch):
    """Two micro-batches a step: the gradients, each micro-batch's sum divided by 2 by Lightning, are multiplied
    by 2 / (the step's tokens) before the optimizer sees them."""
    from llasmol.finetune import rollouts

    seen = []
    real = rollouts.GRPOLoRA.on_before_optimizer_step

    def spy(self, optimizer):
        before = [p.grad.clone() for p in self._trained()]
        real(self, optimizer)
        seen.append((self._step_tokens, [p.grad / b for p, b in zip(self._trained(), before) if b.abs().sum() > 0]))

    monkeypatch.setattr(rollouts.GRPOLoRA, "on_before_optimizer_step", spy)
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "data.effective_batch_size=4"))
    records = _rollouts(tmp_path, 1)
    tokens = sum(r["tokens"] for r in records)
    ((step_tokens, ratios),) = seen
    assert step_tokens == tokens
    for ratio in ratios:
        finite = ratio[torch.isfinite(ratio)]
        torch.testing.assert_close(finite, torch.full_like(finite, 2 / tokens))


def test_a_validation_pays_no_beam_that_never_ended():
    from llasmol.core.tasks import SMOLINSTRUCT
    from llasmol.finetune.validation import GenerationEvaluator
    from llasmol.metrics.rewards import Rewards
    from omegaconf import OmegaConf
    from llasmol.core.config import CONFIG_DIR

    weights = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "reward" / "default.yaml"))
    evaluator = GenerationEvaluator({}, samples_per_task=1, seed=0,
                                    rewards=Rewards(weights, SMOLINSTRUCT, ["forward_synthesis"]))
    gold = "CC(=O)NC1=CC=CC=C1"
    records = [{"task": "forward_synthesis", "gold": [gold], "predictions": [f"<SMILES> {gold} </SMILES>"], "ended": e}
               for e in ([True], [False], [True])]
    out = evaluator._rewarded(records, SMOLINSTRUCT, None)
    assert out["val/reward"] == pytest.approx(1.6 * 2 / 3)
    assert out["val/reward/forward_synthesis/format"] == pytest.approx(2 / 3)
    assert out["val/reward_lo"] <= out["val/reward"] <= out["val/reward_hi"]
    assert out["val/reward_lo"] == pytest.approx(0.0) and out["val/reward_hi"] == pytest.approx(1.6)  # 3 samples
    legacy = [{**r, "ended": None} for r in records]  # a record written before `ended`: taken as ended
    assert evaluator._rewarded(legacy, SMOLINSTRUCT, None)["val/reward"] == pytest.approx(1.6)


@pytest.mark.parametrize("mode, kept, current, replaces", [
    ("max", 0.5, 0.5, True), ("max", 0.5, 0.49, False), ("max", 0.5, 0.51, True),
    ("min", 2.0, 2.0, True), ("min", 2.0, 2.1, False), ("min", 2.0, 1.9, True)])
def test_a_tie_with_the_kept_checkpoint_keeps_the_later_one(mode, kept, current, replaces, tmp_path):
    from types import SimpleNamespace

    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    callback = AdapterModelCheckpoint(dirpath=tmp_path, monitor="val/reward", mode=mode, save_top_k=1)
    callback.best_k_models = {"a.ckpt": torch.tensor(kept)}
    callback.kth_best_model_path = "a.ckpt"
    trainer = SimpleNamespace(strategy=SimpleNamespace(reduce_boolean_decision=lambda decision: decision))
    assert callback.check_monitor_top_k(trainer, torch.tensor(current)) is replaces


def test_train_log_names_the_metric_the_best_checkpoint_is_chosen_by(cfg_factory, tmp_path, crafted, caplog):
    with caplog.at_level("INFO", logger="llasmol.train"):
        result = train(cfg_factory(*GRPO, "trainer.max_steps=2", "val_every_n_steps=1"))
    lines = [line for line in caplog.text.splitlines() if "validation at step" in line]
    logged = _logged(tmp_path)
    values = [logged[s]["val/reward"] for s in (1, 2)]
    best_step = 2 if values[1] >= values[0] else 1  # a tie keeps the later
    assert f"(best val/reward {max(values):.4f} at step {best_step})" in lines[-1]
    assert f"val/reward {values[1]:.4f} [{logged[2]['val/reward_lo']:.4f}, {logged[2]['val/reward_hi']:.4f}]" in lines[-1]
    assert Path(result["best_checkpoint"]).name.startswith(f"step{best_step}-")


def test_a_run_resumes_only_by_the_objective_it_was_trained_by(cfg_factory, tmp_path, crafted):
    """A GRPO run's checkpoint says so: continuing it by SFT (in its folder, or as a sibling `ckpt_path=last`
    finds) is one line before Hydra writes its config there, and a sibling of another objective is passed over."""
    import time

    import torch
    from refusals import refused

    from llasmol.core.run_lock import check_resume_objective, checkpoint_objective, release_run_lock
    from llasmol.finetune.resume import resolve_resume
    from llasmol.train import _claim_run_folder

    root = tmp_path / "outputs"
    grpo_run, sft_run = root / "grpo", root / "sft"
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "checkpoint_every_n_steps=1", f"paths.output_dir={grpo_run}"))
    time.sleep(0.05)
    train(cfg_factory("model.random_init=true", "trainer.max_steps=1", "checkpoint_every_n_steps=1",
                      "val_every_n_steps=100", "callbacks.generation_evaluator.samples_per_task=1",
                      "generation.max_new_tokens_limit=2", "data.tasks=[forward_synthesis]",
                      f"paths.output_dir={sft_run}"))  # newer than the GRPO run
    for run in (grpo_run, sft_run):
        release_run_lock(run)  # held by this process for the life of the train() calls above
    grpo_last, sft_last = (run / "checkpoints" / "last.ckpt" for run in (grpo_run, sft_run))
    assert checkpoint_objective(grpo_last) == "grpo" and checkpoint_objective(sft_last) == "sft"
    with refused(f"ckpt_path={grpo_last} is a checkpoint of objective=grpo", "this run is objective=sft",
                 "init_from=<its run directory>"):
        _claim_run_folder(["ckpt_path=last", f"hydra.run.dir={grpo_run}", "data.tasks=[forward_synthesis]"])
    _claim_run_folder(["ckpt_path=last", f"hydra.run.dir={grpo_run}", "objective=grpo"])  # its own objective: fine
    check_resume_objective(grpo_run, "auto", "grpo")
    with refused("objective=sft"):
        resolve_resume(str(grpo_last), root / "new", "tiny", "full", "sft")
    # ckpt_path=last in a new folder: the newest sibling of the same model, variant and objective
    assert resolve_resume("last", root / "new", "tiny", "full", "grpo") == str(grpo_last)
    assert resolve_resume("last", root / "new", "tiny", "full", "sft") == str(sft_last)
    # A checkpoint from before checkpoints said their objective: a GRPO stage's holds its start
    state = torch.load(grpo_last, weights_only=True)
    del state["objective"]
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    assert checkpoint_objective(old) == "grpo"


@pytest.mark.parametrize("kind, named", [("fifo", "is a named pipe"), ("file", "is a file"),
                                         ("link", "is a symbolic link"), ("dir", None), ("none", None)])
def test_a_grpo_run_folders_rollouts_must_be_its_own_folder(kind, named, tmp_path):
    """A pipe or file there ended the run after its first step; a link wrote the rollouts into another folder."""
    import os

    from refusals import refused

    from llasmol.finetune.preflight import check_rollouts_folder

    path = tmp_path / "rollouts"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_text("x")
    elif kind == "link":
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "dir":
        path.mkdir()
    if named is None:
        check_rollouts_folder(tmp_path)
        return
    with refused(str(path), named, "hydra.run.dir"):
        check_rollouts_folder(tmp_path)


@pytest.mark.parametrize("content, named", [('{"peft_type": "LORA", "r": 8, "target_mod', "is not valid JSON"),
                                            ("[1, 2]", "holds a JSON list"), ("", "is not valid JSON")])
def test_init_from_a_run_whose_adapter_config_is_damaged_is_one_line(cfg_factory, trained_run, tmp_path, content, named):
    import shutil

    from refusals import refused

    from llasmol.inference.loading import starting_adapter

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    for config in run.glob("checkpoints/*.adapter/adapter_config.json"):
        config.write_text(content)
    with refused("adapter_config.json", named):
        starting_adapter(cfg_factory("objective=grpo", f"init_from={run}", "lora=lite"))


def test_the_objectives_sampling_settings_reach_the_sampler(cfg_factory, tmp_path, monkeypatch):
    from llasmol.finetune import rollouts

    calls, real = [], rollouts.sample_group

    def spy(model, ids, mask, generations, limit, temperature, top_p, seed, eos, pad, **kwargs):
        calls.append((generations, limit, temperature, top_p))
        return real(model, ids, mask, generations, limit, temperature, top_p, seed, eos, pad, **kwargs)

    monkeypatch.setattr(rollouts, "sample_group", spy)
    train(cfg_factory(*GRPO, "trainer.max_steps=1", "objective.temperature=0.8", "objective.top_p=0.95",
                      "objective.num_generations=3", "objective.max_new_tokens=6"))
    assert calls == [(3, 6, 0.8, 0.95)]


@pytest.mark.parametrize("signum, code", [(15, 143), (2, 1)])
def test_a_signal_during_a_rollout_stops_at_the_steps_end_and_the_resumed_stage_is_the_unstopped_one(
        cfg_factory, tmp_path, crafted, monkeypatch, signum, code):
    """SIGTERM (a cluster) or Ctrl-C arriving while step 2 samples, as Lightning's own handlers receive them: the step
    ends, interrupted.ckpt holds it, and the resumed stage samples, rewards and learns as the unstopped one."""
    import os

    from llasmol.finetune import rollouts

    settings = [*GRPO, "lora.dropout=0", "scheduler.num_warmup_steps=0", "optimizer.lr=0.01", "trainer.max_steps=3"]
    whole = train(cfg_factory(*settings, f"paths.output_dir={tmp_path / 'whole'}"))
    sampler, calls = rollouts.sample_group, []

    def signalling(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 2's rollout, mid-way
            os.kill(os.getpid(), signum)
        return sampler(*args, **kwargs)

    monkeypatch.setattr(rollouts, "sample_group", signalling)
    with pytest.raises(SystemExit) as stop:
        train(cfg_factory(*settings, f"paths.output_dir={tmp_path / 'cut'}"))
    assert stop.value.code == code
    monkeypatch.setattr(rollouts, "sample_group", sampler)
    saved = torch.load(tmp_path / "cut" / "checkpoints" / "interrupted.ckpt", weights_only=True)
    assert saved["global_step"] == 2 and saved["objective"] == "grpo"
    resumed = train(cfg_factory(*settings, f"paths.output_dir={tmp_path / 'cut'}", "ckpt_path=last"))
    assert resumed["global_step"] == whole["global_step"] == 3
    assert _rollouts(tmp_path / "cut", 3) == _rollouts(tmp_path / "whole", 3)
    cut, full = _logged(tmp_path / "cut"), _logged(tmp_path / "whole")
    assert cut[3]["train/loss"] == pytest.approx(full[3]["train/loss"], abs=1e-6)
