"""Every statistic the GRPO stage logs, pinned to the number a hand count of a fixed rollout gives (issue #67).

The module (`GRPOLoRA`) runs its own rollout, reward, loss and logging code over two optimizer steps of two
micro-batches each, driven in Lightning's order (on_train_batch_start, training_step, backward,
on_before_optimizer_step, the step count moving, on_train_batch_end), with only what is random or slow replaced:
the sampler returns scripted completions (`SCRIPT`), the policy is one scalar `w` whose log-probability of a token
is -1 + w * COEF[token] (so a ratio is exp(Δw * COEF[token]), on both sides of each clip bound), a token's entropy is
0.1 * token + 0.05, the rewards are a table (format 0.5, exact 2.0) and the clocks tick 0.25 s a reading.
Every expected value below is counted from `SCRIPT` in plain Python, not with the product's tensors. Two steps: a
per-step accumulator that is never reset gives step 2 another number. The end-to-end tests
(tests/test_grpo_train.py) check the same keys reach the CSV log through Lightning."""

from __future__ import annotations

import functools
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from llasmol.core.config import compose_config
from llasmol.core.tasks import SMOLINSTRUCT
from llasmol.finetune import module as module_file
from llasmol.finetune import rollouts
from llasmol.finetune.grpo import completion_mask
from llasmol.metrics.extract import extract_answer

EOS, PAD = 1, 0
WORDS = {PAD: "<pad>", EOS: "</s>", 2: "<SMILES>", 3: "</SMILES>", 4: "CCO", 5: "OCC", 6: "<NUMBER>", 7: "</NUMBER>",
         8: "-1.5", 9: "2.0", 10: "x", 11: "y"}
FS, ESOL = "forward_synthesis", "property_prediction-esol"
BOUND = {FS: 6, ESOL: 4}  # each task's new tokens (generation.tasks.<task>.max_new_tokens), under objective's 8
MAX_NEW = 8  # objective.max_new_tokens: wider than any batch here (dr_grpo divides by it, not by the width)
G = 3
TICK = 0.25
# The advantages are float32 tensors (as the rewards are): what is computed from them agrees to float32's rounding
F32 = {"rel": 1e-6, "abs": 1e-7}

CCO, OCC = [2, 4, 3, EOS], [2, 5, 3, EOS]  # a molecule in its tags, ended (4 tokens)
RAMBLE = [10] * 7  # never ends: cut at its task's bound
SHORT = [10, EOS]  # ends at once, no answer (2 tokens)
EMPTY = [EOS]  # nothing but its end: ended (1 token), no answer
NUM_A, NUM_B = [6, 8, 7, EOS], [6, 9, 7, EOS]
NUM_OVER = [6, 8, 7, 10, EOS]  # its end comes after esol's bound of 4: cut there, its answer read but unpaid

# prompt index -> (task, gold, its group's completions, each (ids, tokens counted, clipped, reward, answer))
SCRIPT = {
    0: (FS, "CCO", [(CCO, 4, False, 2.5, "CCO"), (OCC, 4, False, 0.5, "OCC"), (RAMBLE, 6, True, 0.0, None)]),
    2: (ESOL, "-1.5", [(NUM_A, 4, False, 2.5, "-1.5"), (NUM_OVER, 4, True, 0.0, "-1.5"),
                       (NUM_B, 4, False, 0.5, "2.0")]),
    1: (FS, "OCC", [(CCO, 4, False, 0.5, "CCO")] * 3),  # all the same: no signal
    3: (ESOL, "2.0", [(SHORT, 2, False, 0.0, None), (NUM_B, 4, False, 2.5, "2.0"), (NUM_B, 4, False, 2.5, "2.0")]),
    4: (FS, "CCO", [(SHORT, 2, False, 0.0, None), (EMPTY, 1, False, 0.0, None), (SHORT, 2, False, 0.0, None)]),
    5: (FS, "CCO", [(OCC, 4, False, 0.5, "OCC"), (CCO, 4, False, 2.5, "CCO"), (SHORT, 2, False, 0.0, None)]),
    6: (FS, "OCC", [(OCC, 4, False, 2.5, "OCC"), (OCC, 4, False, 2.5, "OCC"), (CCO, 4, False, 0.5, "CCO")]),
    7: (FS, "CCO", [(RAMBLE, 6, True, 0.0, None), (CCO, 4, False, 2.5, "CCO"), (CCO, 4, False, 2.5, "CCO")]),
}
# Two optimizer steps of two micro-batches of two prompts: step 2 draws no esol prompt
STEPS = [[[0, 2], [1, 3]], [[4, 5], [6, 7]]]


# With Δw = 0.5: the end's ratio 0.78 (under 1 - 0.2), token 8's 1.22 (between 1.2 and DAPO's 1.28), 9's 1.35
COEF = {PAD: 0.0, EOS: -0.5, 2: -0.3, 3: 0.1, 4: -0.2, 5: 0.2, 6: 0.0, 7: 0.1, 8: 0.4, 9: 0.6, 10: 0.3, 11: -0.4}
LUT = torch.tensor([COEF[t] for t in range(len(COEF))], dtype=torch.float64)


def coef(token: int) -> float:
    return COEF[token]


def entropy_of(token: int) -> float:
    return 0.1 * token + 0.05


def prompt_row(index: int) -> tuple[list[int], list[int]]:
    """Left-padded prompts of unequal lengths; the index rides in the last position (the fake sampler reads it)."""
    return ([PAD, 50 + index], [0, 1]) if index % 2 else ([40, 50 + index], [1, 1])


class WordTokenizer:
    eos_token_id, pad_token_id = EOS, PAD

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(WORDS[int(i)] for i in ids if not (skip_special_tokens and int(i) in (EOS, PAD)))


class TableRewards:
    """format 0.5 when it ended with an answer, exact 2.0 when that answer is the gold; what it was asked, kept."""

    def __init__(self):
        self.calls = []

    def __call__(self, task, text, golds, ended=True):
        self.calls.append((task, text, list(golds), ended))
        answer = extract_answer(task, text) if ended else None
        terms = {"format": float(answer is not None), "exact": float(answer is not None and answer in golds)}
        return 0.5 * terms["format"] + 2.0 * terms["exact"], terms


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.0, dtype=torch.float64))


class Clock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        self.now += TICK
        return self.now


class Harness:
    """A `GRPOLoRA` over `Policy`, driven through the hooks Lightning calls, everything it logs kept by step."""

    def __init__(self, monkeypatch, tmp_path, *overrides, steps=STEPS, further=None):
        cfg = compose_config(["objective=grpo", "paths.output_dir=/unused", f"objective.num_generations={G}",
                              f"objective.max_new_tokens={MAX_NEW}", *overrides,
                              *(f"+generation.tasks.{task}.max_new_tokens={n}" for task, n in BOUND.items())])
        self.cfg, self.steps, self.tmp_path = cfg, steps, tmp_path
        self.rewards = TableRewards()
        self.sampled, self.logp_calls = [], []
        monkeypatch.setattr(rollouts, "sample_group", self._sample_group)
        monkeypatch.setattr(rollouts, "completion_logps", self._completion_logps)
        monkeypatch.setattr(rollouts, "time", Clock())  # perf_counter: a tick a reading
        monkeypatch.setattr(module_file, "time", Clock())
        self.policy = Policy()
        module = rollouts.GRPOLoRA(self.policy, optimizer=None, objective=cfg.objective, rewards=self.rewards,
                                   tokenizer=WordTokenizer(), generation=cfg.generation, tasks=SMOLINSTRUCT,
                                   seed=cfg.seed, output_dir=str(tmp_path), start=None)
        self.accumulate = len(steps[0])
        self.trainer = SimpleNamespace(global_step=0, current_epoch=0, global_rank=0, world_size=1,
                                       is_global_zero=True, accumulate_grad_batches=self.accumulate, _results=None)
        module.trainer = self.trainer
        module._targets = lambda index: (SCRIPT[index][0], [SCRIPT[index][1]])
        module.optimizers = lambda: SimpleNamespace(param_groups=[{"lr": 0.125}])
        self.logged, self.where = [], None
        module.log = lambda name, value, **kwargs: self.logged.append(
            (self.where, name, float(value.detach()) if torch.is_tensor(value) else float(value)))
        self.further_asked = []
        if further is not None:  # dynamic sampling's further prompts: (batch_idx, round) -> prompt indices
            def further_prompts(count, batch_idx, round_):
                self.further_asked.append((count, batch_idx, round_))
                return batch_of(further[(batch_idx, round_)])
            module._further_prompts = further_prompts
        if cfg.objective.beta:
            module._reference = [torch.tensor(0.0, dtype=torch.float64)]  # the adapters the stage started from: w = 0
        self.module = module

    # -- what stands in for the model
    def _sample_group(self, model, prompt_ids, prompt_mask, num_generations, max_new_tokens, temperature, top_p,
                      seed, eos_id, pad_id, synced_gpus=False):
        indices = [int(i) - 50 for i in prompt_ids[:, -1]]
        self.sampled.append({"indices": indices, "generations": num_generations, "max_new_tokens": max_new_tokens,
                             "temperature": temperature, "top_p": top_p, "eos": eos_id, "pad": pad_id,
                             "training": model.training, "seed": seed})
        rows = [ids[:max_new_tokens] for i in indices for ids, *_ in SCRIPT[i][2]]
        width = max(len(r) for r in rows)
        completion = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
        return completion, completion_mask(completion, eos_id)

    def _completion_logps(self, model, input_ids, attention_mask, length, temperature=1.0, entropy=False):
        self.logp_calls.append({"temperature": temperature, "grad": torch.is_grad_enabled(),
                                "w": float(model.w.detach())})
        tokens = input_ids[:, -length:].double()
        logps = -1.0 + model.w * LUT[input_ids[:, -length:]]
        return (logps, 0.1 * tokens + 0.05) if entropy else logps

    # -- Lightning's order of hooks
    def run(self, weights=None):
        """Both steps; `weights`: w during each step (the optimizer's updates). Returns each step's gradient."""
        grads, batch_idx = [], 0
        for step, micro_batches in enumerate(self.steps):
            if weights is not None:
                with torch.no_grad():
                    self.policy.w.fill_(weights[step])
            for place, indices in enumerate(micro_batches):
                batch = batch_of(indices)
                self.where = ("batch", step + 1, place)
                self.module.on_train_batch_start(batch, batch_idx)
                loss = self.module.training_step(batch, batch_idx)
                (loss / self.accumulate).backward()  # Lightning's division under accumulation
                if place == self.accumulate - 1:
                    self.module.on_before_optimizer_step(None)
                    grads.append(float(self.policy.w.grad))
                    self.policy.w.grad = None
                    self.trainer.global_step += 1
                self.where = ("end", step + 1, place)
                self.module.on_train_batch_end(None, batch, batch_idx)
                batch_idx += 1
        return grads

    def values(self, kind, step, place=None):
        """What was logged in `step` (1-based) at the end of its last micro-batch (`kind` "end") or in the
        training_step of micro-batch `place` ("batch")."""
        out = {}
        for where, name, value in self.logged:
            if where[0] == kind and where[1] == step and (place is None or where[2] == place):
                assert name not in out or kind == "end", f"{name} logged twice in one micro-batch"
                out[name] = value
        return out

    def watched(self, step):
        last = self.accumulate - 1
        return {k: v for k, v in self.values("end", step, last).items() if k != "train/tokens_per_sec"}


def batch_of(indices):
    rows = [prompt_row(i) for i in indices]
    return {"input_ids": torch.tensor([r[0] for r in rows]), "attention_mask": torch.tensor([r[1] for r in rows]),
            "index": torch.tensor(indices)}


# ------------------------------------------------------------------ counted by hand from SCRIPT

def completions(indices):
    """(prompt index, task, gold, ids, tokens, clipped, reward, answer) of each completion, in the rows' order."""
    return [(i, SCRIPT[i][0], SCRIPT[i][1], *c) for i in indices for c in SCRIPT[i][2]]


def advantages_of(rewards):
    """Group-relative advantages (the group's Bessel standard deviation + 1e-4), group by group."""
    out = []
    for g in range(0, len(rewards), G):
        group = rewards[g:g + G]
        mean = sum(group) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (G - 1))
        out += [(r - mean) / (std + 1e-4) for r in group]
    return out


def std1(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def counted_tokens(ids, tokens):
    return ids[:tokens]


STEP_ONE = {  # counted from SCRIPT by hand (rows 0, 2, 1, 3)
    "train/reward": (2.5 + 0.5 + 0 + 2.5 + 0 + 0.5 + 0.5 * 3 + 0 + 2.5 + 2.5) / 12,
    "train/reward_std": (math.sqrt(1.75) + math.sqrt(1.75) + 0 + math.sqrt(75) / 6) / 4,
    "train/no_signal": 1 / 4,
    "train/completion_length": (4 + 4 + 6 + 4 * 3 + 4 * 3 + 2 + 4 + 4) / 12,
    "train/completion_clipped": 2 / 12, "train/completion_ended": 10 / 12,
    "train/collapse/top_answer_share": (1 / 3 + 2 / 3 + 3 / 3 + 2 / 3) / 4,  # CCO|OCC, -1.5 twice, CCO x3, 2.0 twice
    "train/collapse/distinct_answers": (2 + 2 + 1 + 1) / 4,
    "train/resampled_groups": 0.0, "train/left_out": 0.0,
    f"train/reward/{FS}": (2.5 + 0.5 + 0 + 1.5) / 6, f"train/reward/{FS}/std": (math.sqrt(1.75) + 0) / 2,
    f"train/reward/{FS}/format": 5 / 6, f"train/reward/{FS}/exact": 1 / 6,
    f"train/reward/{ESOL}": (2.5 + 0 + 0.5 + 0 + 2.5 + 2.5) / 6,
    f"train/reward/{ESOL}/std": (math.sqrt(1.75) + math.sqrt(75) / 6) / 2,
    f"train/reward/{ESOL}/format": 4 / 6, f"train/reward/{ESOL}/exact": 3 / 6,
}
STEP_TWO = {  # rows 4, 5, 6, 7: forward synthesis alone
    "train/reward": (0 + 3 + 5.5 + 5) / 12,
    "train/reward_std": (0 + std1([0.5, 2.5, 0]) + std1([2.5, 2.5, 0.5]) + std1([0, 2.5, 2.5])) / 4,
    "train/no_signal": 1 / 4,
    "train/completion_length": (2 + 1 + 2 + 10 + 12 + 14) / 12,
    "train/completion_clipped": 1 / 12, "train/completion_ended": 11 / 12,
    "train/collapse/top_answer_share": (0 + 1 / 3 + 2 / 3 + 2 / 3) / 4,  # a group that answered nothing: 0 and 0
    "train/collapse/distinct_answers": (0 + 2 + 2 + 1) / 4,
    "train/resampled_groups": 0.0, "train/left_out": 0.0,
    f"train/reward/{FS}": (0 + 3 + 5.5 + 5) / 12,
    f"train/reward/{FS}/std": (0 + std1([0.5, 2.5, 0]) + std1([2.5, 2.5, 0.5]) + std1([0, 2.5, 2.5])) / 4,
    f"train/reward/{FS}/format": 7 / 12, f"train/reward/{FS}/exact": 5 / 12,
}


def test_the_scripts_hand_counts_are_what_the_script_says():
    """The hand-counted tables above against SCRIPT itself (a typo in them would pin a wrong number)."""
    for step, expected in ((0, STEP_ONE), (1, STEP_TWO)):
        rows = completions([i for batch in STEPS[step] for i in batch])
        rewards = [r[6] for r in rows]
        assert expected["train/reward"] == pytest.approx(np.mean(rewards), abs=1e-12)
        assert expected["train/completion_length"] == pytest.approx(np.mean([r[4] for r in rows]), abs=1e-12)
        assert expected["train/completion_clipped"] == pytest.approx(np.mean([r[5] for r in rows]), abs=1e-12)
        terms = {}
        for i, task, gold, ids, tokens, clipped, reward, answer in rows:
            text = WordTokenizer().decode(ids[:tokens], skip_special_tokens=True)
            assert clipped == (ids[tokens - 1] != EOS) and tokens == min(len(ids), BOUND[task])
            paid, paid_terms = TableRewards()(task, text, [gold], not clipped)
            assert answer == extract_answer(task, text) and reward == paid
            for term, value in paid_terms.items():
                terms.setdefault(f"train/reward/{task}/{term}", []).append(value)
        assert {k: expected[k] for k in terms} == pytest.approx({k: np.mean(v) for k, v in terms.items()}, abs=1e-12)


@pytest.mark.parametrize("truncated_out", [False, True])
def test_every_statistic_of_two_steps_is_the_hand_count_of_their_rollouts(monkeypatch, tmp_path, truncated_out):
    """dapo, one pass over each rollout (ratio 1): every key `_watch_step` logs, the loss, the clip shares, the
    entropy, both speeds and the gradient the optimizer sees, step by step; with mask_truncated_completions the
    cut completions leave the loss, the entropy and dapo's divisor but not the completion statistics."""
    h = Harness(monkeypatch, tmp_path, f"objective.mask_truncated_completions={str(truncated_out).lower()}")
    grads = h.run(weights=[0.0, 0.0])
    for step, expected in ((1, STEP_ONE), (2, STEP_TWO)):
        micro_batches = STEPS[step - 1]
        rows = completions([i for batch in micro_batches for i in batch])
        trained = [r for r in rows if not (truncated_out and r[5])]
        tokens = [t for r in trained for t in counted_tokens(r[3], r[4])]
        watched = h.watched(step)
        entropy = sum(entropy_of(t) for t in tokens) / len(tokens)
        fresh = sum(r[4] for r in rows)
        assert watched == pytest.approx({**expected, "train/entropy": entropy,
                                         "train/rollout_tokens_per_sec": fresh / (2 * TICK)}, abs=1e-12)
        # The loss of each micro-batch: ratio 1, so -A per token; dapo logs the micro-batch's mean per token, and each
        # micro-batch logs the mean over the step's micro-batches so far (the step's last: the step's mean, as TRL's)
        step_sum, step_tokens, losses = 0.0, 0, []
        for place, indices in enumerate(micro_batches):
            mine = completions(indices)
            advantages = advantages_of([r[6] for r in mine])
            kept = [(a, counted_tokens(r[3], r[4])) for a, r in zip(advantages, mine) if not (truncated_out and r[5])]
            count = sum(len(t) for _, t in kept)
            batch = h.values("batch", step, place)
            losses.append(sum(-a * len(t) for a, t in kept) / count)
            assert batch == pytest.approx({"train/loss": sum(losses) / len(losses),
                                           "train/clip_ratio/low": 0.0, "train/clip_ratio/high": 0.0,
                                           "train/clip_ratio/region": 0.0, "train/lr": 0.125}, **F32)
            # train/tokens_per_sec: the rollout's real tokens (prompts of each row, completions in the loss) a tick
            prompt_tokens = sum(sum(prompt_row(i)[1]) for i in indices) * G
            assert h.values("end", step, place)["train/tokens_per_sec"] == pytest.approx(
                (prompt_tokens + count) / TICK, abs=1e-9)
            step_sum += sum(-a * sum(coef(x) for x in t) for a, t in kept)
            step_tokens += count
        # dapo: d/dw of the step's token sum over the step's tokens (both micro-batches, this step's only)
        assert grads[step - 1] == pytest.approx(step_sum / step_tokens, **F32)
    # rollouts/step{S}.jsonl: each completion with its reward, terms, advantage and place in its step
    for step in (1, 2):
        written = [json.loads(line) for line in (tmp_path / "rollouts" / f"step{step}.jsonl").read_text().splitlines()]
        rows = completions([i for batch in STEPS[step - 1] for i in batch])
        advantages = [a for batch in STEPS[step - 1] for a in advantages_of([r[6] for r in completions(batch)])]
        assert [(r["index"], r["task"], r["tokens"], r["clipped"], r["reward"], r["answer"], r["round"], r["kept"],
                 r["reused"]) for r in written] == [(i, task, n, cut, reward, answer, 0, True, False)
                                                    for i, task, _, _, n, cut, reward, answer in rows]
        assert [r["advantage"] for r in written] == pytest.approx(advantages, **F32)
        assert [r["terms"] for r in written] == [{"format": float(a is not None and not cut),
                                                  "exact": float(a == gold and not cut)}
                                                 for _, _, gold, _, _, cut, _, a in rows]


def test_the_sampler_and_the_rewards_are_asked_what_the_settings_and_the_bounds_say(monkeypatch, tmp_path):
    """Each micro-batch samples with the objective's settings, in eval mode, up to the longest bound of its tasks;
    each completion is rewarded on its text through its own bound, told whether it ended there; the
    log-probabilities are taken at the sampling temperature, with a gradient only in the training step."""
    h = Harness(monkeypatch, tmp_path, "objective.temperature=0.7", "objective.top_p=0.9")
    h.policy.train()
    h.run()
    assert [(s["indices"], s["generations"], s["max_new_tokens"], s["temperature"], s["top_p"], s["eos"], s["pad"],
             s["training"]) for s in h.sampled] == [
        ([0, 2], G, 6, 0.7, 0.9, EOS, PAD, False), ([1, 3], G, 6, 0.7, 0.9, EOS, PAD, False),  # fs's 6 over esol's 4
        ([4, 5], G, 6, 0.7, 0.9, EOS, PAD, False), ([6, 7], G, 6, 0.7, 0.9, EOS, PAD, False)]
    assert h.policy.training  # back in training mode after sampling
    # Each rollout's seed is a function of (seed, epoch, micro-batch, rank) and the rollout mark alone: a resumed
    # run samples the same completions, and no two micro-batches share one
    assert [s["seed"] for s in h.sampled] == [
        int(np.random.SeedSequence([h.cfg.seed, 0, batch_idx, 0, rollouts.ROLLOUT_SEED]).generate_state(1)[0])
        for batch_idx in range(4)] and rollouts.ROLLOUT_SEED == 1
    rows = completions([i for step in STEPS for batch in step for i in batch])
    assert h.rewards.calls == [(task, WordTokenizer().decode(ids[:n], skip_special_tokens=True), [gold], not cut)
                               for _, task, gold, ids, n, cut, _, _ in rows]
    assert h.logp_calls == [{"temperature": 0.7, "grad": True, "w": 0.0}] * 4  # one pass each, nothing else


def hand_policy_loss(rows, advantages, old_w, new_w, ref_w, loss_type, level, beta, eps_low=0.2, eps_high=0.28):
    """The policy loss and its statistics for completions `rows` (ids, tokens) counted position by position."""
    terms, lows, highs, regions, kls, n_tokens = [], [], [], [], [], 0
    for (ids, count), a in zip(rows, advantages):
        tokens = ids[:count]
        log_ratios = [(new_w - old_w) * coef(t) for t in tokens]
        if level == "sequence":
            ratios = [math.exp(sum(log_ratios) / len(tokens))] * len(tokens)
        else:
            ratios = [math.exp(x) for x in log_ratios]
        per = []
        for t, r in zip(tokens, ratios):
            term = -min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)
            gap = (ref_w - new_w) * coef(t)
            kl = (math.exp(gap) - gap - 1) * r
            kls.append(kl)
            per.append(term + beta * kl)
        terms.append(per)
        flags = [(r < 1 - eps_low and a < 0, r > 1 + eps_high and a > 0) for r in ratios]
        if level == "sequence":
            flags = flags[:1]  # one ratio a completion: counted once, over the completions
        lows += [float(lo) for lo, _ in flags]
        highs += [float(hi) for _, hi in flags]
        regions += [float(lo or hi) for lo, hi in flags]
        n_tokens += count
    total = sum(sum(p) for p in terms)
    loss = {"grpo": sum(sum(p) / len(p) for p in terms) / len(terms), "dr_grpo": total / (len(terms) * MAX_NEW),
            "bnpo": total / n_tokens, "dapo": total / n_tokens}[loss_type]  # dapo: its mean per token is logged
    stats = {"train/clip_ratio/low": np.mean(lows), "train/clip_ratio/high": np.mean(highs),
             "train/clip_ratio/region": np.mean(regions)}
    if beta:
        stats["train/kl"] = sum(kls) / len(kls)
    return loss, stats


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "dapo"])
def test_a_rollout_trained_on_again_logs_its_clip_shares_kl_and_loss_as_counted(monkeypatch, tmp_path, loss_type,
                                                                                level):
    """num_iterations=2, beta 0.04, epsilon 0.2, epsilon_high 0.28: step 1 samples at w = 0.1 (ratio 1; the
    reference, the starting adapters, is w = 0), step 2 trains on step 1's rollouts again at w = 0.6, so the ratios
    run from 0.78 to 1.35 (token 8's 1.22 is clipped only under a bound of 0.2, not DAPO's 0.28). The batches are
    narrower than objective.max_new_tokens (dr_grpo's divisor); a step's row holds only its own tasks' keys."""
    h = Harness(monkeypatch, tmp_path, f"objective.loss_type={loss_type}",
                f"objective.importance_sampling_level={level}",
                "objective.num_iterations=2", "objective.beta=0.04", "objective.epsilon_high=0.28")
    h.run(weights=[0.1, 0.6])
    for step, new_w in ((1, 0.1), (2, 0.6)):
        counted = []  # each micro-batch's own values; a micro-batch logs their mean over the step so far
        for place, indices in enumerate(STEPS[0]):  # step 2 trains on step 1's rollouts
            mine = completions(indices)
            advantages = advantages_of([r[6] for r in mine])
            loss, stats = hand_policy_loss([(r[3], r[4]) for r in mine], advantages, 0.1, new_w, 0.0, loss_type, level,
                                           0.04)
            counted.append({"train/loss": loss, **stats})
            means = {key: sum(c[key] for c in counted) / len(counted) for key in counted[0]}
            assert h.values("batch", step, place) == pytest.approx({**means, "train/lr": 0.125}, **F32), (step, place)
    shares = h.values("batch", 2, 1)
    if level == "token":  # the batch reaches both clips (the hand count could be 0 = 0 otherwise)
        assert shares["train/clip_ratio/low"] > 0 and shares["train/clip_ratio/high"] > 0
    # The rollouts of step 2 are step 1's, marked reused; only step 1 sampled (and only it has a sampling speed)
    assert len(h.sampled) == 2
    assert "train/rollout_tokens_per_sec" in h.watched(1) and "train/rollout_tokens_per_sec" not in h.watched(2)
    assert h.watched(2) == pytest.approx({k: v for k, v in h.watched(1).items()
                                          if k != "train/rollout_tokens_per_sec"}, abs=1e-12)
    written = [json.loads(line) for line in (tmp_path / "rollouts" / "step2.jsonl").read_text().splitlines()]
    assert [r["reused"] for r in written] == [True] * 12
    # the old log-probabilities at w = 0.1 and the reference's at w = 0, both without a gradient, at the rollout
    assert [(c["w"], c["grad"]) for c in h.logp_calls] == (
        [(0.1, False), (0.0, False), (0.1, True)] * 2 + [(0.6, True)] * 2)


@pytest.mark.parametrize("mode, further, expected, trained", [
    ("none", None, [{"train/no_signal": 0.5, "train/left_out": 0.0, "train/resampled_groups": 0.0},
                    {"train/no_signal": 0.5, "train/left_out": 0.0, "train/resampled_groups": 0.0}], [[1, 0], [4, 6]]),
    ("skip", None, [{"train/no_signal": 0.5, "train/left_out": 0.5, "train/resampled_groups": 0.0},
                    {"train/no_signal": 0.5, "train/left_out": 0.5, "train/resampled_groups": 0.0}], [[0], [6]]),
    # step 1: round 1's prompt teaches nothing, round 2's fills the slot; step 2: neither round teaches
    ("refill", {(0, 1): [4], (0, 2): [5], (1, 1): [1], (1, 2): [4]},
     [{"train/no_signal": 0.5, "train/left_out": 0.0, "train/resampled_groups": 2.0},
      {"train/no_signal": 0.5, "train/left_out": 0.5, "train/resampled_groups": 2.0}], [[5, 0], [6]]),
])
def test_dynamic_sampling_counts_its_groups_step_by_step(monkeypatch, tmp_path, mode, further, expected, trained):
    """One micro-batch a step, one group that teaches nothing in each ([1, 0], then [4, 6]): what each mode keeps,
    refills and logs, the rewards of the step's own prompts only, and the loss and entropy of the groups trained on
    (`trained`) alone."""
    steps = [[[1, 0]], [[4, 6]]]
    h = Harness(monkeypatch, tmp_path, f"objective.dynamic_sampling={mode}", "objective.max_resamples=2",
                steps=steps, further=further)
    h.run()
    for step, want, groups in zip((1, 2), expected, trained):
        own = completions(steps[step - 1][0])
        got = h.watched(step)
        assert {k: got[k] for k in want} == pytest.approx(want, abs=1e-12)
        assert got["train/reward"] == pytest.approx(np.mean([r[6] for r in own]), abs=1e-12)
        rows = completions(groups)
        tokens = [t for r in rows for t in counted_tokens(r[3], r[4])]
        assert got["train/entropy"] == pytest.approx(sum(entropy_of(t) for t in tokens) / len(tokens), abs=1e-12)
        advantages = [a for i in groups for a in advantages_of([r[6] for r in completions([i])])]
        assert h.values("batch", step, 0)["train/loss"] == pytest.approx(
            sum(-a * r[4] for a, r in zip(advantages, rows)) / len(tokens), **F32)
    if mode == "refill":
        assert h.further_asked == [(1, 0, 1), (1, 0, 2), (1, 1, 1), (1, 1, 2)]  # one empty slot, two rounds each
        assert [s["seed"] for s in h.sampled] == [  # each round its own seed: the round is added to the step's
            int(np.random.SeedSequence([h.cfg.seed, 0, batch_idx, 0, 1, *([round_] if round_ else [])]
                                       ).generate_state(1)[0]) for batch_idx in (0, 1) for round_ in (0, 1, 2)]
        written = [json.loads(line) for line in (tmp_path / "rollouts" / "step1.jsonl").read_text().splitlines()]
        assert [(r["index"], r["round"], r["kept"]) for r in written] == (
            [(1, 0, False)] * 3 + [(0, 0, True)] * 3 + [(4, 1, False)] * 3 + [(5, 2, True)] * 3)
    else:
        assert h.further_asked == []


def test_the_advantages_of_groups_of_two_are_the_hand_counts_for_each_scaling():
    """num_generations=2, the smallest group the config allows: (r - mean) / (Bessel std + 1e-4); a tie is 0."""
    from llasmol.finetune.grpo import group_advantages

    rewards = torch.tensor([2.5, 0.5, 1.0, 1.0, 0.0, 2.0])
    half = math.sqrt(2.0)  # the Bessel std of (2.5, 0.5) and of (0, 2): |a - b| / sqrt(2)
    group = [1.0 / (half + 1e-4), -1.0 / (half + 1e-4), 0.0, 0.0, -1.0 / (half + 1e-4), 1.0 / (half + 1e-4)]
    batch_std = std1([2.5, 0.5, 1.0, 1.0, 0.0, 2.0])
    expected = {"group": group, "none": [1.0, -1.0, 0.0, 0.0, -1.0, 1.0],
                "batch": [d / (batch_std + 1e-4) for d in (1.0, -1.0, 0.0, 0.0, -1.0, 1.0)]}
    for scale, want in expected.items():
        assert group_advantages(rewards, 2, scale).tolist() == pytest.approx(want, **F32), scale


# ------------------------------------------------------------------ validation: val/reward and its interval

def test_validation_rewards_are_the_hand_means_of_the_top_answers_and_the_interval_takes_the_settings(monkeypatch):
    """Two tasks, the first prediction of each sample rewarded (told whether it ended; no prediction: ""), per
    task and per term; the interval is mean_interval's over every sample with the intervals settings given."""
    from llasmol.finetune import validation

    asked = []
    monkeypatch.setattr(validation, "mean_interval",
                        lambda values, resamples, seed, level: asked.append((values, resamples, seed, level))
                        or (-1, 9))
    rewards = TableRewards()
    evaluator = validation.GenerationEvaluator({}, samples_per_task=2, seed=0, rewards=rewards,
                                               intervals={"resamples": 7, "seed": 3, "level": 0.9})
    records = [
        {"task": FS, "gold": ["CCO"], "predictions": ["<SMILES> CCO </SMILES>", "x"], "ended": [True, True]},  # 2.5
        {"task": ESOL, "gold": ["2.0"], "predictions": ["<NUMBER> 2.0 </NUMBER>"], "ended": [False]},  # cut: 0
        {"task": FS, "gold": ["OCC"], "predictions": ["<SMILES> CCO </SMILES>"], "ended": [True]},  # 0.5
        {"task": ESOL, "gold": ["-1.5"], "predictions": [], "ended": []},  # no answer: 0
        {"task": ESOL, "gold": ["-1.5"], "predictions": ["<NUMBER> -1.5 </NUMBER>"], "ended": [True]},  # 2.5
    ]
    out = evaluator._rewarded(records, SMOLINSTRUCT, None)
    assert out == pytest.approx({
        "val/reward": (2.5 + 0 + 0.5 + 0 + 2.5) / 5, "val/reward_lo": -1, "val/reward_hi": 9,
        f"val/reward/{FS}": (2.5 + 0.5) / 2, f"val/reward/{FS}/format": 1.0, f"val/reward/{FS}/exact": 0.5,
        f"val/reward/{ESOL}": 2.5 / 3, f"val/reward/{ESOL}/format": 1 / 3, f"val/reward/{ESOL}/exact": 1 / 3,
    }, abs=1e-12)
    assert [(c[0], c[3]) for c in rewards.calls] == [
        (FS, True), (ESOL, False), (FS, True), (ESOL, False), (ESOL, True)]  # no prediction: not ended
    assert asked == [([2.5, 0.5, 0.0, 0.0, 2.5], 7, 3, 0.9)]  # every sample once, task by task
    evaluator.intervals = {"resamples": 0, "seed": 3, "level": 0.9}  # intervals.resamples=0: none, as documented
    without = evaluator._rewarded(records, SMOLINSTRUCT, None)
    assert len(asked) == 1 and without == {k: v for k, v in out.items() if k not in ("val/reward_lo", "val/reward_hi")}


def test_a_validation_whose_samples_all_earn_the_same_has_an_interval_of_that_value():
    from llasmol.finetune.validation import GenerationEvaluator

    evaluator = GenerationEvaluator({}, samples_per_task=2, seed=0, rewards=TableRewards(),
                                    intervals={"resamples": 50, "seed": 0, "level": 0.95})
    records = [{"task": FS, "gold": ["CCO"], "predictions": ["<SMILES> CCO </SMILES>"], "ended": [True]}] * 4
    out = evaluator._rewarded(records, SMOLINSTRUCT, None)
    assert (out["val/reward"], out["val/reward_lo"], out["val/reward_hi"]) == pytest.approx((2.5, 2.5, 2.5), abs=1e-12)


# ------------------------------------------------------------------ the report's GRPO table

def test_the_reports_grpo_table_averages_each_watched_series_over_the_steps_since_the_last_validation(tmp_path):
    """csv/metrics.csv as Lightning writes it (a row per step, validations in rows of their own, empty cells):
    each validation's row holds val/reward, its interval, each term, and the mean of each watched series over
    the steps after the previous validation up to and including its own (a missing value is left out)."""
    from llasmol.analysis.grpo_stage import WATCHED, is_grpo, stage_table
    from llasmol.analysis.runs import load_run

    columns = ["epoch", "step", *WATCHED, "val/reward", "val/reward_lo", "val/reward_hi", f"val/reward/{FS}/format",
               f"val/reward/{FS}/exact", f"val/reward/{FS}"]
    train = {0: [0.1, 0.5, 0.5, 1.0, 1.0, 2.0, 0.0], 1: [0.3, 0.7, 0.3, 0.5, 2.0, None, 1.0],
             2: [0.5, 0.9, 0.1, 1 / 3, 3.0, 3.0, 0.5], 3: [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0],
             4: [2.0, 0.0, 1.0, 0.0, 0.0, 0.5, 1.0], 5: [9.0] * 7}
    vals = {2: [0.4, 0.3, 0.5, 0.8, 0.2, 0.6], 4: [0.9, 0.8, 1.0, 1.0, 0.7, 1.1]}
    lines = [",".join(columns)]
    for step in range(6):
        lines.append(",".join(["0", str(step), *("" if v is None else repr(v) for v in train[step]), "", "", "", "", "",
                               ""]))
        if step in vals:
            lines.append(",".join(["0", str(step), *[""] * len(WATCHED), *map(repr, vals[step])]))
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    run = load_run(tmp_path)
    assert is_grpo(run)
    table = stage_table(run)
    assert table.columns == ["step", "val/reward", "lo", "hi", f"val/reward/{FS}/exact", f"val/reward/{FS}/format",
                             *(f"{name} (mean)" for name in WATCHED)]

    def means(steps):
        out = []
        for k in range(len(WATCHED)):
            values = [train[s][k] for s in steps if train[s][k] is not None]
            out.append(sum(values) / len(values))
        return out

    expected = [[2, 0.4, 0.3, 0.5, 0.2, 0.8, *means([0, 1, 2])], [4, 0.9, 0.8, 1.0, 0.7, 1.0, *means([3, 4])]]
    assert len(table.rows) == 2
    for got, want in zip(table.rows, expected):
        assert got == pytest.approx(want, abs=1e-12)


# ------------------------------------------------------------------ TRL's defaults

# conf/objective/grpo.yaml's key -> GRPOConfig's: the same default (what users trust the stage to be)
SAME_AS_TRL = {"temperature": "temperature", "top_p": "top_p", "loss_type": "loss_type",
               "scale_rewards": "scale_rewards", "epsilon": "epsilon", "epsilon_high": "epsilon_high", "beta": "beta",
               "num_iterations": "num_iterations", "importance_sampling_level": "importance_sampling_level",
               "use_bias_correction_kl": "use_bias_correction_kl",
               "mask_truncated_completions": "mask_truncated_completions"}
# Declared differences: ours, TRL's, and why (conf/objective/grpo.yaml's comments say the same)
DIFFERS_FROM_TRL = {"num_generations": (4, "num_generations", 8, "halved for a CPU"),
                    "max_new_tokens": (256, "max_completion_length", 512, "SMolInstruct's answers are short")}
# Every flag of GRPOConfig's own that TRL turns on by default: implemented (ours on too), or why it does not apply
TRL_ON_BY_DEFAULT = {
    "use_bias_correction_kl": "implemented: objective.use_bias_correction_kl, on by default",
    "shuffle_dataset": "implemented: the training loader shuffles (data's sampler)",
    "ds3_gather_for_generation": "DeepSpeed ZeRO-3 only: llasmol has no DeepSpeed trainer",
    "vllm_importance_sampling_correction": "vLLM only (use_vllm, off by default): llasmol samples with generate",
    "log_multimodal": "logging of image inputs: no images here",
}


@functools.lru_cache(maxsize=None)
def default_objective():
    return compose_config(["objective=grpo", "paths.output_dir=/unused"]).objective


@pytest.mark.parametrize("ours, theirs", sorted(SAME_AS_TRL.items()))
def test_each_objective_default_is_trls_default(ours, theirs):
    import dataclasses

    from trl import GRPOConfig

    trl_default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}[theirs]
    assert default_objective()[ours] == trl_default
    if ours in {f.name for f in dataclasses.fields(rollouts.PolicyLoss)}:  # what the loss is built with
        assert getattr(rollouts.PolicyLoss.of(default_objective()), ours) == trl_default


def test_the_defaults_that_differ_from_trls_are_the_declared_ones_and_every_flag_trl_turns_on_is_accounted_for():
    import dataclasses

    from transformers import TrainingArguments
    from trl import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    objective = default_objective()
    for ours, (value, theirs, trl_value, _why) in DIFFERS_FROM_TRL.items():
        assert (objective[ours], defaults[theirs]) == (value, trl_value), ours
    own = {f.name for f in dataclasses.fields(GRPOConfig)} - {f.name for f in dataclasses.fields(TrainingArguments)}
    assert {name for name in own if defaults[name] is True} == set(TRL_ON_BY_DEFAULT)
    assert defaults["top_k"] == 0  # what sample_group passes (tests/test_grpo.py: the spy on generate)
    # The objective's every key is TRL's, a declared difference, or a setting TRL has no default for here
    beyond_trl = {"name", "soft_punish_cache", "dynamic_sampling", "max_resamples"}
    assert set(objective) == set(SAME_AS_TRL) | set(DIFFERS_FROM_TRL) | beyond_trl


# ------------------------------------------------------------------ the rewards of each task's tags

GOLDS = {"smiles": "CCO", "formula": "C2H6O", "iupac": "ethanol", "number": "-1.5", "boolean": "Yes"}


@pytest.mark.parametrize("task", [t for t in SMOLINSTRUCT if SMOLINSTRUCT.task(t).family != "caption"])
def test_each_task_pays_its_gold_between_its_own_tags_and_nothing_between_another_tag(task):
    """Every term of every tagged task's family is 1 for the gold in the task's tags, and every term is 0 for the
    same answer in any other task's tags. (Captions, untagged and paid by METEOR: tests/test_rewards.py.)"""
    from omegaconf import OmegaConf

    from llasmol.core.config import CONFIG_DIR
    from llasmol.metrics.extract import wrap_answer
    from llasmol.metrics.rewards import TERMS, Rewards

    weights = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "reward" / "default.yaml"))
    row = SMOLINSTRUCT.task(task)
    gold = GOLDS[row.family]
    rewards = Rewards(weights, SMOLINSTRUCT, [task])
    total, terms = rewards(task, wrap_answer(task, gold), [gold])
    assert list(terms) == list(TERMS[row.family])
    for term, value in terms.items():
        assert value == pytest.approx(1.0, abs=1e-12), term
    assert total == pytest.approx(sum(weights["families"][row.family].values()), abs=1e-12)
    for other in {SMOLINSTRUCT.task(t).answer_tag for t in SMOLINSTRUCT} - {row.answer_tag, None}:
        paid, terms = rewards(task, f"<{other}> {gold} </{other}>", [gold])
        assert paid == 0 and set(terms.values()) == {0.0}, other
