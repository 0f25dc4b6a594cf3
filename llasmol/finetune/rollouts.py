"""The GRPO objective as a LightningModule (`objective=grpo`): each training micro-batch of prompts is answered by
a group of sampled completions, each completion rewarded by the paper's own metrics (`llasmol.metrics.rewards`),
and the adapters are pushed towards the completions that beat their group (`llasmol.finetune.grpo`).

It is `LoRACausalLM` with another training step: the same checkpoints (adapters only), resume, validation
(val/loss on the validation split's answers, and the validation callback's beam search and metrics), loggers and
strategies. What differs from TRL's `GRPOTrainer`, said once here:

- a micro-batch's prompts are sampled, rewarded and trained on at once (TRL generates for several micro-batches
  ahead); `scale_rewards=batch` and `dapo`'s token count therefore cover one micro-batch of one process;
- sampling runs with dropout off (the model in eval mode), the log-probabilities with the training step's
  dropout (TRL samples in whatever mode the model is in);
- with `num_iterations` above 1 a micro-batch's rollout is kept and trained on again in the next steps (in the
  checkpoint too), and the prompts the loader gives in those steps are passed over.

The reference of the KL term (`beta > 0`) is the adapters the stage started from (`init_from`, or fresh ones: the
base itself), kept as a copy of the adapter tensors and swapped in for the reference pass: never a second base.
Every completion, its reward and each term are written to `rollouts/step{S}.jsonl` (S: the optimizer steps done).
"""

from __future__ import annotations

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
from llasmol.inference.beam_search import forward_is_collective, task_settings
from llasmol.inference.pipeline import gather_to_all, split_golds
from llasmol.metrics.rewards import Rewards

ROLLOUT_SEED = 1  # told apart from StepSeeding's dropout draws of the same (seed, epoch, batch, rank)


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


class GRPOLoRA(LoRACausalLM):
    """Trains `model`'s adapters by GRPO on the prompts of the training split (`data`'s prompts_only batches)."""

    def __init__(self, model: torch.nn.Module, optimizer: Callable[..., torch.optim.Optimizer],
                 scheduler: Optional[Callable[..., Any]] = None, *, objective, rewards: Rewards, tokenizer,
                 generation, tasks: TaskTable, seed: int, output_dir: str, start: Optional[str] = None) -> None:
        """`objective`: the objective group's settings (conf/objective/grpo.yaml); `generation`: the generation
        group, whose per-task max_new_tokens bound each completion as they bound generation; `start`: the adapter
        folder the stage starts from (`init_from`'s), None for fresh adapters."""
        super().__init__(model, optimizer, scheduler)
        self.settings = objective
        self.policy_loss = PolicyLoss(objective.loss_type, objective.epsilon, objective.epsilon_high, objective.beta,
                                      objective.max_new_tokens)
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

    def _roll_out(self, batch: dict, batch_idx: int) -> Rollout:
        groups = self.settings.num_generations
        indices = batch["index"].tolist()
        targets = [self._targets(i) for i in indices]
        limits = torch.tensor([self._limit(task) for task, _ in targets], device=batch["input_ids"].device)
        entropy = [self.seed, self.trainer.current_epoch, batch_idx, self.trainer.global_rank, ROLLOUT_SEED]
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
        seconds = time.perf_counter() - started
        # Each completion within its own task's bound (one generate call serves the batch's longest bound).
        positions = torch.arange(completion.size(1), device=completion.device)
        mask = mask * (positions[None, :] < limits.repeat_interleave(groups)[:, None]).int()
        rewards, records = [], []
        for row in range(completion.size(0)):
            index, (task, golds) = indices[row // groups], targets[row // groups]
            length = int(mask[row].sum())
            text = self.tokenizer.decode(completion[row, :length], skip_special_tokens=True).strip()
            reward, terms = self.rewards(task, text, golds)
            rewards.append(reward)
            # Clipped: cut at its bound before its end of sequence (one that ends exactly there is whole).
            clipped = length >= int(limits[row // groups]) and int(completion[row, length - 1]) != self.eos_id
            records.append({"index": index, "task": task, "completion": text, "tokens": length, "reward": reward,
                            "terms": terms, "clipped": clipped})
        rewards_t = torch.tensor(rewards, dtype=torch.float32, device=completion.device)
        advantages = group_advantages(rewards_t, groups, self.settings.scale_rewards)
        for record, advantage in zip(records, advantages.tolist()):
            record["advantage"] = advantage
        prompts = batch["input_ids"].repeat_interleave(groups, dim=0)
        prompt_mask = batch["attention_mask"].repeat_interleave(groups, dim=0)
        input_ids, attention_mask = torch.cat([prompts, completion], 1), torch.cat([prompt_mask, mask.long()], 1)
        old = ref = None
        with torch.no_grad():
            if self.settings.num_iterations > 1:
                old = self._logps(input_ids, attention_mask, completion.size(1))
            if self.settings.beta:
                with self._as_reference():
                    ref = self._logps(input_ids, attention_mask, completion.size(1))
        self._sampling_seconds += seconds
        return Rollout(input_ids, attention_mask, mask, advantages, old, ref, records)

    def _logps(self, input_ids, attention_mask, length: int) -> torch.Tensor:
        return completion_logps(self.model, input_ids, attention_mask, length, float(self.settings.temperature))

    def _watch_step(self, records: list[dict], seconds: float) -> None:
        """What RL users watch of a step, from all its completions (every micro-batch of every process): rewards
        overall, per task and per term, with their spread within groups; how many completions teach nothing
        (their group all earned the same); completion lengths and how many hit their bound; sampling speed.
        A task the step drew no prompt of logs nothing this step."""
        forget_step_values(self.trainer, "train/reward/")  # else Lightning writes a task's last value again
        n = len(records)
        rewards = np.array([r["reward"] for r in records])
        groups = rewards.reshape(-1, self.settings.num_generations)
        lengths = np.array([r["tokens"] for r in records], dtype=float)
        self.log("train/reward", float(rewards.mean()), prog_bar=True, batch_size=n)
        self.log("train/reward_std", float(groups.std(axis=1, ddof=1).mean()), batch_size=n)
        self.log("train/no_signal", float(np.isclose(groups.max(axis=1), groups.min(axis=1)).mean()), batch_size=n)
        self.log("train/completion_length", float(lengths.mean()), batch_size=n)
        self.log("train/completion_clipped", float(np.mean([r.get("clipped", False) for r in records])), batch_size=n)
        if seconds > 0:
            self.log("train/rollout_tokens_per_sec", float(lengths[[not r["reused"] for r in records]].sum()) / seconds,
                     batch_size=n)
        by_task: dict[str, list[int]] = {}
        for i, record in enumerate(records):
            by_task.setdefault(record["task"], []).append(i)
        for task, rows in by_task.items():
            mine = [records[i] for i in rows]
            self.log(f"train/reward/{task}", float(np.mean([r["reward"] for r in mine])), batch_size=len(mine))
            task_groups = sorted({i // self.settings.num_generations for i in rows})
            self.log(f"train/reward/{task}/std", float(groups[task_groups].std(axis=1, ddof=1).mean()),
                     batch_size=len(mine))
            for term in mine[0]["terms"]:
                self.log(f"train/reward/{task}/{term}", float(np.mean([r["terms"][term] for r in mine])),
                         batch_size=len(mine))

    # ------------------------------------------------------------------ the step

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self._records_step != self.global_step:  # the step's first micro-batch
            self._records, self._records_step, self._sampling_seconds = [], self.global_step, 0.0
        place = batch_idx % self.trainer.accumulate_grad_batches
        reuse = self.global_step % self.settings.num_iterations != 0 and place in self._kept
        rollout = self._kept[place] if reuse else self._roll_out(batch, batch_idx)
        if self.settings.num_iterations > 1:
            self._kept[place] = rollout
        self._keep_records(rollout.records, reused=reuse)
        length = rollout.completion_mask.size(1)
        logps = self._logps(rollout.input_ids, rollout.attention_mask, length)
        loss, stats = self.policy_loss(logps, rollout.advantages, rollout.completion_mask, rollout.old_logps,
                                       rollout.ref_logps)
        if not torch.isfinite(loss):
            raise UserError(f"the GRPO loss became {loss.item()} in step {self.global_step + 1}: lower optimizer.lr "
                            f"(now {self.optimizers().param_groups[0]['lr']:g}) or objective.beta, then resume from "
                            "the last good checkpoint (ckpt_path=last)")
        n = rollout.input_ids.size(0)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        for name, value in stats.items():
            self.log(f"train/{name}", value, batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=n)
        self._batch_tokens = int(rollout.attention_mask.sum())
        return loss

    # ------------------------------------------------------------------ rollouts/step{S}.jsonl

    def _keep_records(self, records: list[dict], reused: bool) -> None:
        self._records.extend({**r, "reused": reused} for r in records)

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.global_step > self._records_step >= 0:  # the step's optimizer update is done: its records are whole
            everything = gather_to_all(self._records)  # every rank, together (collective)
            slowest = max(gather_to_all([self._sampling_seconds]))  # the ranks sample side by side
            if self.trainer.is_global_zero:
                write_jsonl(self.output_dir / ROLLOUTS / f"step{self.global_step}.jsonl", everything)
            self._watch_step(everything, slowest)  # the same numbers on every rank
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
