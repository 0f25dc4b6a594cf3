"""The GRPO objective as a LightningModule (`objective=grpo`): each training micro-batch of prompts is answered by
a group of sampled completions, each completion rewarded by the paper's own metrics (`llasmol.metrics.rewards`),
and the adapters are pushed towards the completions that beat their group (`llasmol.finetune.grpo`).

It is `LoRACausalLM` with another training step: the same checkpoints (adapters only), resume, validation
(val/loss on the validation split's answers, and the validation callback's beam search and metrics), loggers and
strategies. What differs from TRL's `GRPOTrainer`, said once here:

- a micro-batch's prompts are sampled, rewarded and trained on at once (TRL generates for several micro-batches
  ahead); `scale_rewards=batch` therefore covers one micro-batch of one process, while `dapo` divides the
  gradients by the whole step's tokens once the step's last micro-batch is done (`on_before_optimizer_step`),
  which equals TRL's division by the generation batch's tokens;
- sampling runs with dropout off (the model in eval mode), the log-probabilities with the training step's
  dropout (TRL samples in whatever mode the model is in);
- with `num_iterations` above 1 a micro-batch's rollout is kept and trained on again in the next steps (in the
  checkpoint too), and the prompts the loader gives in those steps are passed over.

The reference of the KL term (`beta > 0`) is the adapters the stage started from (`init_from`, or fresh ones: the
base itself), kept as a copy of the adapter tensors and swapped in for the reference pass: never a second base.
Every completion, its reward and each term are written to `rollouts/step{S}.jsonl` (S: the optimizer steps done).

Beyond TRL, by setting (conf/objective/grpo.yaml): DAPO's dynamic sampling (`dynamic_sampling`): the groups of a
micro-batch whose completions all earned the same reward teach nothing; `skip` leaves them out of the loss,
`refill` samples groups of further training prompts in their place, `max_resamples` rounds at most, and leaves out
what is still uninformative after them.
"""

from __future__ import annotations

import collections
import contextlib
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from llasmol.core.errors import UserError
from llasmol.core.files import write_jsonl
from llasmol.core.run_dir import ROLLOUTS
from llasmol.core.tasks import TaskTable
from llasmol.finetune.grpo import PolicyLoss, completion_logps, group_advantages, sample_group
from llasmol.finetune.lightning_private import forget_step_values
from llasmol.finetune.module import LoRACausalLM
from llasmol.inference.beam_search import forward_is_collective, most_of_any_rank, task_settings
from llasmol.inference.pipeline import gather_to_all, split_golds
from llasmol.metrics.extract import extract_answer
from llasmol.metrics.rewards import Rewards, overlong_penalty

ROLLOUT_SEED = 1  # told apart from StepSeeding's dropout draws of the same (seed, epoch, batch, rank)
REFILL_SEED = 2  # the further prompts of dynamic sampling, drawn per (seed, epoch, batch, rank, round)


@dataclass
class Rollout:
    """One micro-batch's completions and what the loss needs of them (rows: each prompt's group side by side)."""

    input_ids: torch.Tensor  # prompt then completion, left-padded prompts
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor  # 1 on each completion's tokens through its end of sequence
    advantages: torch.Tensor
    old_logps: Optional[torch.Tensor]  # the policy's when sampled (num_iterations > 1), else None
    ref_logps: Optional[torch.Tensor]  # the reference's (beta > 0), else None
    records: list  # one dict per completion: index, task, completion, tokens, reward, terms, clipped, advantage

    def state(self) -> dict:
        """Plain tensors and containers (a checkpoint is read weights-only)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _merged(parts: list[dict], chosen: list[tuple[int, int]], kept: list[bool], groups: int, pad_id: int) -> dict:
    """The micro-batch's rollout from the groups `chosen` ((part, group) per slot) of the rounds' `parts`: prompts
    left-padded to the widest, completions right-padded to the longest; a slot not `kept` is in the batch with its
    completion mask zeroed (left out of the loss; every process still runs its forward and backward)."""
    width = max(p["prompts"].size(1) for p in parts)
    length = max(p["completion"].size(1) for p in parts)
    out = {"prompts": [], "prompt_mask": [], "completion": [], "mask": [], "rewards": []}
    for slot, (part_at, g) in enumerate(chosen):
        part, rows = parts[part_at], slice(g * groups, (g + 1) * groups)
        left, right = width - part["prompts"].size(1), length - part["completion"].size(1)
        pad = torch.nn.functional.pad
        out["prompts"].append(pad(part["prompts"][rows], (left, 0), value=pad_id))
        out["prompt_mask"].append(pad(part["prompt_mask"][rows], (left, 0), value=0))
        out["completion"].append(pad(part["completion"][rows], (0, right), value=pad_id))
        out["mask"].append(pad(part["mask"][rows], (0, right), value=0) * int(kept[slot]))
        out["rewards"].append(part["rewards"][g])
    return {key: torch.cat(values) if key != "rewards" else torch.stack(values) for key, values in out.items()}


class GRPOLoRA(LoRACausalLM):
    """Trains `model`'s adapters by GRPO on the prompts of the training split (`data`'s prompts_only batches)."""

    objective = "grpo"

    def __init__(self, model: torch.nn.Module, optimizer: Callable[..., torch.optim.Optimizer],
                 scheduler: Optional[Callable[..., Any]] = None, *, objective, rewards: Rewards, tokenizer,
                 generation, tasks: TaskTable, seed: int, output_dir: str, start: Optional[str] = None) -> None:
        """`objective`: the objective group's settings (conf/objective/grpo.yaml); `generation`: the generation
        group, whose per-task max_new_tokens bound each completion as they bound generation; `start`: the adapter
        folder the stage starts from (`init_from`'s), None for fresh adapters."""
        super().__init__(model, optimizer, scheduler)
        self.settings = objective
        self.policy_loss = PolicyLoss.of(objective)
        self.rewards = rewards
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.generation = generation
        self.tasks = tasks
        self.seed = seed
        self.output_dir = Path(output_dir)
        self.start = str(start) if start is not None else None
        self._golds = None  # the training split's golds, pooled as the scorer pools them (built at fit start)
        self._kept: dict[int, Rollout] = {}  # micro-batch place in its step -> its rollout (num_iterations > 1)
        self._reference: Optional[list[torch.Tensor]] = None
        self._records: list[dict] = []  # this step's completions on this process, its micro-batches in order
        self._records_step = -1
        self._sampling_seconds = 0.0
        self._step_tokens = 0  # completion tokens in this step's loss on this process (dapo's divisor)
        self._entropy = [0.0, 0]  # this step's token entropy sum and count on this process
        self._step_stats: dict[str, list[float]] = {}  # this step's loss, clip and KL values, a micro-batch each

    # ------------------------------------------------------------------ what one completion is worth

    def on_fit_start(self) -> None:
        split = self.trainer.datamodule.split("train")
        self._split, self._golds = split, split_golds(split)

    def _targets(self, index: int) -> tuple[str, list[str]]:
        sample = self._split[index]
        return sample["task"], self._golds.golds(sample, sample["raw_output"])

    def _limit(self, task: str) -> int:
        return min(self.settings.max_new_tokens, task_settings(self.generation, task, self.tasks).max_new_tokens)

    # ------------------------------------------------------------------ the reference policy

    def configure_model(self) -> None:
        super().configure_model()  # sharded first (trainer=fsdp): the copy is of this rank's shards
        if self.settings.beta and self._reference is None:
            # The adapters as the stage starts (init_from's), before a resume restores later ones.
            self._reference = [p.detach().clone() for p in self._trained()]

    def _trained(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def _as_reference(self):
        params = self._trained()
        current = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, ref in zip(params, self._reference):
                p.copy_(ref)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, now in zip(params, current):
                    p.copy_(now)

    # ------------------------------------------------------------------ rollouts

    def _sample(self, batch: dict, batch_idx: int, round_: int) -> dict:
        """One round of rollouts of `batch`'s prompts: their completions, rewards and records (round 0: the
        loader's batch; later rounds: dynamic sampling's further prompts)."""
        groups = self.settings.num_generations
        indices = batch["index"].tolist()
        targets = [self._targets(i) for i in indices]
        limits = torch.tensor([self._limit(task) for task, _ in targets], device=batch["input_ids"].device)
        entropy = [self.seed, self.trainer.current_epoch, batch_idx, self.trainer.global_rank, ROLLOUT_SEED]
        if round_:
            entropy.append(round_)
        started = time.perf_counter()
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling
        try:
            completion, mask = sample_group(
                self.model, batch["input_ids"], batch["attention_mask"], groups, int(limits.max()),
                float(self.settings.temperature), float(self.settings.top_p),
                int(np.random.SeedSequence(entropy).generate_state(1)[0]), self.eos_id, self.pad_id,
                synced_gpus=forward_is_collective(self.model))
        finally:
            self.model.train(was_training)
        self._sampling_seconds += time.perf_counter() - started
        # Each completion within its own task's bound (one generate call serves the batch's longest bound).
        positions = torch.arange(completion.size(1), device=completion.device)
        row_limits = limits.repeat_interleave(groups)
        mask = mask * (positions[None, :] < row_limits[:, None]).int()
        cache = int(self.settings.soft_punish_cache)
        rewards, records = [], []
        for row in range(completion.size(0)):
            index, (task, golds) = indices[row // groups], targets[row // groups]
            length = int(mask[row].sum())
            text = self.tokenizer.decode(completion[row, :length], skip_special_tokens=True).strip()
            # Ended: its end of sequence came within its bound; else it was cut there (clipped).
            ended = length > 0 and int(completion[row, length - 1]) == self.eos_id
            reward, terms = self.rewards(task, text, golds, ended)
            if cache:  # DAPO's soft overlong punishment, added to the reward as TRL's reward function adds it
                terms["overlong"] = overlong_penalty(length, int(row_limits[row]), cache)
                reward += terms["overlong"]
            rewards.append(reward)
            records.append({"index": index, "task": task, "completion": text, "tokens": length, "reward": reward,
                            "terms": terms, "clipped": not ended, "answer": extract_answer(task, text, self.tasks),
                            "round": round_})
        if self.settings.mask_truncated_completions:  # TRL's: a completion cut at its bound is left out of the loss
            mask = mask * torch.tensor([not r["clipped"] for r in records], device=mask.device).int()[:, None]
        prompts = batch["input_ids"].repeat_interleave(groups, dim=0)
        prompt_mask = batch["attention_mask"].repeat_interleave(groups, dim=0)
        return {"prompts": prompts, "prompt_mask": prompt_mask, "completion": completion, "mask": mask,
                "rewards": torch.tensor(rewards, dtype=torch.float32).view(-1, groups), "records": records}

    def _further_prompts(self, count: int, batch_idx: int, round_: int) -> dict:
        """`count` training prompts drawn at random (seeded by the step's place and the round) for dynamic
        sampling's refills, batched as the loader batches them."""
        dataset = self.trainer.datamodule.dataset("train")
        entropy = [self.seed, self.trainer.current_epoch, batch_idx, self.trainer.global_rank, REFILL_SEED, round_]
        picks = np.random.default_rng(entropy).choice(len(dataset), size=count, replace=count > len(dataset))
        batch = self.trainer.datamodule.train_collate([dataset[int(i)] for i in picks])
        return {k: v.to(self.device) for k, v in batch.items()}

    def _roll_out(self, batch: dict, batch_idx: int) -> Rollout:
        groups, mode = self.settings.num_generations, self.settings.dynamic_sampling
        first = self._sample(batch, batch_idx, 0)
        parts, chosen = [first], [(0, g) for g in range(first["rewards"].size(0))]
        teaches = [bool(first["rewards"][g].max() > first["rewards"][g].min()) for g in range(len(chosen))]
        if mode == "refill":
            lockstep = forward_is_collective(self.model)  # a sharded model's ranks sample round for round together
            for round_ in range(1, int(self.settings.max_resamples) + 1):
                empty = [slot for slot, ok in enumerate(teaches) if not ok]
                wanted = most_of_any_rank(len(empty), self.device) if lockstep else len(empty)
                if not wanted:
                    break
                # A rank with nothing to refill still samples (one prompt, kept nowhere) while the others do
                more = self._sample(self._further_prompts(max(1, len(empty)), batch_idx, round_), batch_idx, round_)
                parts.append(more)
                useful = [g for g in range(more["rewards"].size(0)) if more["rewards"][g].max() > more["rewards"][g].min()]
                for slot, g in zip(empty, useful):
                    chosen[slot], teaches[slot] = (len(parts) - 1, g), True
        kept = teaches if mode != "none" else [True] * len(chosen)
        rollout = _merged(parts, chosen, kept, groups, self.pad_id)
        for part_at, part in enumerate(parts):
            for g in range(part["rewards"].size(0)):
                slot = chosen.index((part_at, g)) if (part_at, g) in chosen else None
                for record in part["records"][g * groups:(g + 1) * groups]:
                    record["kept"], record["advantage"] = slot is not None and kept[slot], 0.0
        advantages = group_advantages(rollout["rewards"].flatten().to(rollout["mask"].device), groups,
                                      self.settings.scale_rewards)
        for slot, (part_at, g) in enumerate(chosen):
            for record, advantage in zip(parts[part_at]["records"][g * groups:(g + 1) * groups],
                                         advantages[slot * groups:(slot + 1) * groups].tolist()):
                record["advantage"] = advantage if kept[slot] else 0.0
        records = [r for part in parts for r in part["records"]]
        input_ids = torch.cat([rollout["prompts"], rollout["completion"]], 1)
        attention_mask = torch.cat([rollout["prompt_mask"], rollout["mask"].long()], 1)
        old = ref = None
        with torch.no_grad():
            if self.settings.num_iterations > 1:
                old = self._logps(input_ids, attention_mask, rollout["completion"].size(1))
            if self.settings.beta:
                with self._as_reference():
                    ref = self._logps(input_ids, attention_mask, rollout["completion"].size(1))
        return Rollout(input_ids, attention_mask, rollout["mask"], advantages, old, ref, records)

    def _logps(self, input_ids, attention_mask, length: int) -> torch.Tensor:
        return completion_logps(self.model, input_ids, attention_mask, length, float(self.settings.temperature))

    def _watch_step(self, records: list[dict], seconds: float, entropy: tuple[float, int]) -> None:
        """What RL users watch of a step, from all its completions (every micro-batch of every process). Of the
        completions of the step's own prompts (round 0; dynamic sampling's further prompts are counted apart):
        rewards overall, per task and per term, with their spread within groups; the share of groups that teach
        nothing (all earned the same); completion lengths, the shares that ended and that were cut at their bound;
        collapse, per group: the most frequent answer's share of the group and the number of distinct answers (a
        completion without an answer counts in neither: 0 and 0 for a group that answered nothing). Of the step:
        further groups sampled (`resampled_groups`), the share of its groups left out of the loss, the policy's
        mean token entropy over the completions trained on (`entropy`: its sum and count), sampling speed.
        A task the step drew no prompt of logs nothing this step."""
        forget_step_values(self.trainer, "train/reward/")  # else Lightning writes a task's last value again
        size = self.settings.num_generations
        own = [r for r in records if r.get("round", 0) == 0]
        n = len(own)
        rewards = np.array([r["reward"] for r in own])
        groups = rewards.reshape(-1, size)
        lengths = np.array([r["tokens"] for r in own], dtype=float)
        clipped = np.array([r.get("clipped", False) for r in own], dtype=float)
        # An answer is the scorer's reading of a completion; a completion without one is no answer (not counted)
        counts = [collections.Counter(a for i in range(size) if (a := own[g * size + i].get("answer")) is not None)
                  for g in range(len(groups))]
        self.log("train/reward", float(rewards.mean()), prog_bar=True, batch_size=n)
        self.log("train/reward_std", float(groups.std(axis=1, ddof=1).mean()), batch_size=n)
        self.log("train/no_signal", float(np.isclose(groups.max(axis=1), groups.min(axis=1)).mean()), batch_size=n)
        self.log("train/completion_length", float(lengths.mean()), batch_size=n)
        self.log("train/completion_clipped", float(clipped.mean()), batch_size=n)
        self.log("train/completion_ended", float(1.0 - clipped.mean()), batch_size=n)
        self.log("train/collapse/top_answer_share",
                 float(np.mean([max(c.values(), default=0) / size for c in counts])), batch_size=n)
        self.log("train/collapse/distinct_answers", float(np.mean([len(c) for c in counts])), batch_size=n)
        kept_groups = sum(1 for r in records if r.get("kept", True)) / size
        self.log("train/resampled_groups", float(sum(1 for r in records if r.get("round", 0)) / size), batch_size=n)
        self.log("train/left_out", float(1.0 - kept_groups / len(groups)), batch_size=n)
        if entropy[1]:
            self.log("train/entropy", entropy[0] / entropy[1], batch_size=n)
        if seconds > 0:
            fresh = [r["tokens"] for r in records if not r["reused"]]
            self.log("train/rollout_tokens_per_sec", float(sum(fresh)) / seconds, batch_size=n)
        by_task: dict[str, list[int]] = {}
        for i, record in enumerate(own):
            by_task.setdefault(record["task"], []).append(i)
        for task, rows in by_task.items():
            mine = [own[i] for i in rows]
            self.log(f"train/reward/{task}", float(np.mean([r["reward"] for r in mine])), batch_size=len(mine))
            task_groups = sorted({i // size for i in rows})
            self.log(f"train/reward/{task}/std", float(groups[task_groups].std(axis=1, ddof=1).mean()),
                     batch_size=len(mine))
            for term in mine[0]["terms"]:
                self.log(f"train/reward/{task}/{term}", float(np.mean([r["terms"][term] for r in mine])),
                         batch_size=len(mine))

    # ------------------------------------------------------------------ the step

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self._records_step != self.global_step:  # the step's first micro-batch
            self._records, self._records_step, self._sampling_seconds = [], self.global_step, 0.0
            self._step_tokens, self._entropy, self._step_stats = 0, [0.0, 0], {}
        place = batch_idx % self.trainer.accumulate_grad_batches
        reuse = self.global_step % self.settings.num_iterations != 0 and place in self._kept
        rollout = self._kept[place] if reuse else self._roll_out(batch, batch_idx)
        if self.settings.num_iterations > 1:
            self._kept[place] = rollout
        self._keep_records(rollout.records, reused=reuse)
        length = rollout.completion_mask.size(1)
        logps, entropies = completion_logps(self.model, rollout.input_ids, rollout.attention_mask, length,
                                            float(self.settings.temperature), entropy=True)
        loss, stats = self.policy_loss(logps, rollout.advantages, rollout.completion_mask, rollout.old_logps,
                                       rollout.ref_logps)
        if not torch.isfinite(loss):
            raise UserError(f"the GRPO loss became {loss.item()} in step {self.global_step + 1}: lower optimizer.lr "
                            f"(now {self.optimizers().param_groups[0]['lr']:g}) or objective.beta, then resume from "
                            "the last good checkpoint (ckpt_path=last)")
        mask = rollout.completion_mask.to(entropies.dtype)
        tokens = int(rollout.completion_mask.sum())
        self._step_tokens += tokens
        self._entropy = [self._entropy[0] + float((entropies * mask).sum()), self._entropy[1] + tokens]
        n = rollout.input_ids.size(0)
        # dapo's loss is the micro-batch's sum (divided by the step's tokens later): its mean per token is logged.
        # Each value is the mean over the step's micro-batches so far, as TRL logs it: Lightning keeps a step's last
        # logged value, which is then the whole step's mean, not its last micro-batch's.
        shown = loss / max(1, tokens) if self.policy_loss.loss_type == "dapo" else loss
        for name, value in {"loss": float(shown.detach()), **stats}.items():
            seen = self._step_stats.setdefault(name, [])
            seen.append(float(value))
            self.log(f"train/{name}", sum(seen) / len(seen), prog_bar=name == "loss", batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=n)
        self._batch_tokens = int(rollout.attention_mask.sum())
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """`dapo`: the gradients, summed over the step's micro-batches (each divided by the accumulation, by
        Lightning) and averaged over the processes, become the sum over the step's every completion token divided
        by their count: TRL's division by the generation batch's tokens."""
        if self.policy_loss.loss_type != "dapo":
            return
        tokens = torch.tensor([float(self._step_tokens)], device=self.device)
        if self.trainer.world_size > 1:
            torch.distributed.all_reduce(tokens)
        scale = self.trainer.accumulate_grad_batches * self.trainer.world_size / max(1.0, float(tokens))
        for p in self._trained():
            if p.grad is not None:
                p.grad.mul_(scale)

    # ------------------------------------------------------------------ rollouts/step{S}.jsonl

    def _keep_records(self, records: list[dict], reused: bool) -> None:
        self._records.extend({**r, "reused": reused} for r in records)

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.global_step > self._records_step >= 0:  # the step's optimizer update is done: its records are whole
            everything = gather_to_all(self._records)  # every rank, together (collective)
            slowest = max(gather_to_all([self._sampling_seconds]))  # the ranks sample side by side
            entropy = [sum(x) for x in zip(*gather_to_all([self._entropy]))]
            if self.trainer.is_global_zero:
                write_jsonl(self.output_dir / ROLLOUTS / f"step{self.global_step}.jsonl", everything)
            self._watch_step(everything, slowest, entropy)  # the same numbers on every rank
            self._records, self._records_step = [], -1

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["grpo_start"] = self.start  # the KL's reference: checked when the stage resumes
        if self._kept:
            checkpoint["grpo_rollouts"] = {place: r.state() for place, r in self._kept.items()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        started = checkpoint.get("grpo_start", self.start)
        if self.settings.beta and started != self.start:
            # The reference is copied from the adapters as this process starts: another init_from, or none, would
            # pull the resumed stage towards other weights than the interrupted one's.
            raise UserError(f"this GRPO stage started from {started or 'fresh adapters (no init_from)'}, its KL "
                            f"reference (objective.beta={self.settings.beta}), but resuming it starts from "
                            f"{self.start or 'fresh adapters'}: resume with init_from="
                            f"{started if started else 'null'}, as the stage began")
        self._kept = {int(place): Rollout(**state) for place, state in (checkpoint.get("grpo_rollouts") or {}).items()}
