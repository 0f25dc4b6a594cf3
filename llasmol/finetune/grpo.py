"""The GRPO objective's arithmetic: group-relative advantages, completion log-probabilities and the clipped policy
loss, as TRL's `GRPOTrainer` (trl 1.16, the reference users trust) computes them; tests/test_grpo.py holds the loss
and the adapter gradients equal to TRL's own `_compute_loss` on a fixed batch, for each loss type.

What each piece is (G completions of one prompt form a group; T completion positions, `mask` 1 on real tokens):

- advantages: a completion's reward minus its group's mean, divided by the group's standard deviation (Bessel's
  correction) plus 1e-4 (`scale_rewards="group"`, TRL's default), by the whole batch's (`"batch"`), or not
  divided (`"none"`, Dr. GRPO's advice: the division favours groups of nearly equal rewards);
- ratio r = exp(logp - logp_old) per token; the policy term -min(r·A, clip(r, 1 - epsilon, 1 + epsilon_high)·A)
  (DAPO's "clip higher" when epsilon_high > epsilon); with beta > 0 the k3 estimate of KL to the reference,
  exp(ref - logp) - (ref - logp) - 1, added times beta;
- `importance_sampling_level`: the ratio per token (TRL's default), or per sequence, exp of the mean of a
  completion's token log-ratios, the same for all its tokens (GSPO, arXiv 2507.18071);
- with beta > 0 the KL term is multiplied by the ratio (`use_bias_correction_kl`, TRL's default: the unbiased
  reverse-KL gradient of DeepSeek-V3.2), which changes its gradient even where the ratio is 1;
- the loss types differ only in how per-token terms become one number: `grpo` averages each completion's tokens,
  then the completions (DeepSeekMath); `dr_grpo` sums every token and divides by completions × the longest
  completion allowed, so no length is favoured (Dr. GRPO, arXiv 2503.20783); `bnpo` divides the micro-batch's sum
  by its own tokens; `dapo` divides by the tokens of the whole generation batch, every micro-batch of the optimizer
  step on every process (DAPO, arXiv 2503.14476: every token of the step weighs the same). A micro-batch cannot
  know the tokens of those still to come, so `dapo`'s loss here is the micro-batch's plain sum and its gradients
  are divided once the step's count is known (`GRPOLoRA.on_before_optimizer_step`): TRL's `dapo` exactly.

Gradient accumulation is Lightning's (it divides each micro-batch's loss by the accumulation), so nothing here
divides by it.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Optional

import torch

from llasmol.core.schema import SCALE_REWARDS

STD_EPSILON = 1e-4  # added to the standard deviation before dividing, as TRL does


@dataclass(frozen=True)
class PolicyLoss:
    """The settings of the loss, as conf/objective/grpo.yaml names them: their defaults are there (TRL's, where TRL
    has the setting) and their bounds are checked with the config (`core/schema.py`), once."""

    loss_type: str
    epsilon: float  # lower clip: ratios below 1 - epsilon with a negative advantage stop pulling
    epsilon_high: Optional[float]  # upper clip; None: epsilon (DAPO recommends 0.28)
    beta: float  # weight of the KL to the reference; 0: no reference pass at all
    max_new_tokens: int  # dr_grpo's constant divisor (TRL's max_completion_length)
    importance_sampling_level: str  # token, or sequence (GSPO)
    use_bias_correction_kl: bool

    @classmethod
    def of(cls, objective) -> "PolicyLoss":
        """The loss of the objective group's settings (`objective`: conf/objective/grpo.yaml as composed)."""
        return cls(**{f.name: objective[f.name] for f in fields(cls)})

    @property
    def upper(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def __call__(self, logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                 old_logps: Optional[torch.Tensor] = None, ref_logps: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of completions whose per-token log-probabilities under the policy are `logps` (B, T), and
        what RL users watch (clip fractions, KL). `old_logps`: the policy's when the rollout was sampled (None:
        this very policy, the first pass over a rollout); `ref_logps`: the reference's (needed when beta > 0).
        For `dapo` the loss is the micro-batch's sum, to be divided by the step's tokens (the module docstring)."""
        mask = mask.to(logps.dtype)
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        old = logps.detach() if old_logps is None else old_logps
        log_ratio = logps - old
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # (B, 1)
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1 - self.epsilon, 1 + self.upper)
        per_token = -torch.min(ratio * advantages, clipped * advantages)
        stats: dict[str, float] = {}
        if self.beta != 0.0:
            if ref_logps is None:
                raise ValueError("beta > 0 needs the reference's log-probabilities")
            gap = ref_logps - logps
            kl = torch.exp(gap) - gap - 1
            if self.use_bias_correction_kl:
                kl = kl * ratio
            stats["kl"] = _masked_mean(kl.detach(), mask)  # as it enters the loss (TRL logs it so too)
            per_token = per_token + self.beta * kl
        per_token = per_token.expand_as(mask)  # a sequence-level ratio is one value for all of a completion's tokens
        if self.loss_type == "grpo":
            loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        elif self.loss_type == "dr_grpo":
            loss = (per_token * mask).sum() / (per_token.size(0) * self.max_new_tokens)
        elif self.loss_type == "bnpo":
            loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        else:  # dapo: divided by the step's tokens once they are known
            loss = (per_token * mask).sum()
        # Shares of the tokens whose ratio is clipped (of the completions, for a sequence-level ratio, as TRL counts)
        low = ((ratio < 1 - self.epsilon) & (advantages < 0)).to(logps.dtype)
        high = ((ratio > 1 + self.upper) & (advantages > 0)).to(logps.dtype)
        stats.update({"clip_ratio/low": _masked_mean(low, mask), "clip_ratio/high": _masked_mean(high, mask),
                      "clip_ratio/region": _masked_mean(torch.maximum(low, high), mask)})
        return loss, stats


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of `values` over the real tokens of `mask`; of a (B, 1) per-completion value, over the completions."""
    if values.size(-1) == 1 and mask.size(-1) != 1:
        return float(values.mean())
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))


def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> torch.Tensor:
    """The advantages of `rewards` (B,), B = prompts × `num_generations`, each prompt's completions side by side;
    a group whose rewards are all equal gets 0 (it teaches nothing: `train/no_signal` counts them)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards {scale_rewards!r} is none of {', '.join(SCALE_REWARDS)}")
    if num_generations < 2 or rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not make groups of num_generations={num_generations} (>= 2)")
    groups = rewards.view(-1, num_generations)
    advantages = rewards - groups.mean(dim=1).repeat_interleave(num_generations)
    if scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)  # Bessel's correction, as torch's and TRL's
    else:
        std = groups.std(dim=1).repeat_interleave(num_generations)
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPSILON)
    return advantages


def completion_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int,
                     temperature: float = 1.0, entropy: bool = False):
    """The log-probability (B, T) of each of the last `completion_length` tokens of `input_ids` (prompt then
    completion, left-padded prompts) under `model`, its logits divided by `temperature` as they were when the
    completions were sampled; with `entropy`, also the entropy (B, T) of each of those positions' distributions (no
    gradient: what `train/entropy` reports). Only the positions that predict a completion token go through the
    output layer where the base takes `logits_to_keep` (a 150k-word vocabulary over a long prompt is the largest
    tensor)."""
    keep = {"logits_to_keep": completion_length + 1} if _keeps_logits(type(_base_of(model))) else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **keep).logits
    logits = logits[:, -completion_length - 1:-1].float() / temperature  # position t predicts token t + 1
    targets = input_ids[:, -completion_length:]
    logps = torch.log_softmax(logits, dim=-1)
    chosen = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return chosen
    with torch.no_grad():
        entropies = -(logps.exp() * logps).sum(-1)
    return chosen, entropies


def _base_of(model):
    """The transformers model under PEFT's wrapper (the one whose forward takes the keyword)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@functools.lru_cache(maxsize=None)
def _keeps_logits(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


@torch.no_grad()
def sample_group(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int,
                 max_new_tokens: int, temperature: float, top_p: float, seed: int, eos_id: int, pad_id: int,
                 synced_gpus: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`num_generations` sampled completions of each left-padded prompt, a prompt's side by side (B·G rows, as
    `group_advantages` reads them): (completion ids, mask). The mask is 1 through the first end of sequence and 0
    after it. Sampling draws from a generator seeded with `seed` alone (the process's own random state is left as
    it was), so that a rollout is a function of its step: what exact resume needs. `synced_gpus`: the model is
    sharded over processes (`beam_search.forward_is_collective`), which generate in lockstep."""
    ids = prompt_ids.repeat_interleave(num_generations, dim=0)
    mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # top_k and repetition_penalty named, as TRL names them: transformers' default top_k (50) or a base's own
        # penalty (Qwen2.5-Instruct's 1.05) would sample from another distribution than the loss's softmax(logits / T)
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=top_p,
                             top_k=0, repetition_penalty=1.0, max_new_tokens=max_new_tokens, num_beams=1,
                             eos_token_id=eos_id, pad_token_id=pad_id, synced_gpus=synced_gpus)
    completion = out[:, ids.size(1):]
    return completion, completion_mask(completion, eos_id)


def completion_mask(completion: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 through each row's first end of sequence (the end itself is learnt), 0 after it."""
    ended = (completion == eos_id).int()
    return ((ended.cumsum(dim=1) - ended) == 0).int()
