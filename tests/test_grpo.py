"""The GRPO objective's arithmetic equals TRL's GRPOTrainer (trl, a test dependency): on one fixed batch (prompts,
completions, their masks, advantages, old and reference log-probabilities) the loss and every adapter gradient
equal those of TRL's own `_compute_loss` and log-probability pass, for each loss type, with and without the KL
term."""

from __future__ import annotations

from collections import defaultdict
from types import MethodType, SimpleNamespace

import pytest
import torch
from conftest import compose_config

from llasmol.finetune.grpo import PolicyLoss, completion_logps, completion_mask, group_advantages

trl = pytest.importorskip("trl")
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from trl.trainer.utils import add_fused_lm_head, nanstd  # noqa: E402

TEMPERATURE = 0.7
PROMPT, COMPLETION, GROUP = 5, 4, 3


@pytest.fixture(scope="module")
def policy():
    """The tiny base with LoRA `lite` whose B matrices are not zero (at zero every A gradient is zero, and a
    wrong A gradient would pass), TRL's log-probability head added before PEFT as TRL does."""
    from llasmol.model.base import load_base_model, load_tokenizer
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["model=tiny", "lora=lite", "lora.dropout=0"])  # dropout would differ call to call
    base = load_base_model(cfg.model, load_tokenizer(cfg.model))
    add_fused_lm_head(base, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    model = apply_lora(base, cfg.model, cfg.lora)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.train()


def _batch(vocab: int):
    """2 prompts x 3 completions: left-padded prompts, completions that end early (mask 0 after their end)."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, vocab, (2 * GROUP, PROMPT), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[0, :2] = prompt_mask[3, :1] = 0
    completion_ids = torch.randint(3, vocab, (2 * GROUP, COMPLETION), generator=g)
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, 2:] = completion_mask[4, 1:] = completion_mask[5, 3:] = 0
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _trl_self(loss_type: str, beta: float, epsilon_high: float):
    """What TRL's `_compute_loss` reads of its trainer, set as a GRPOConfig would set it (one process, no
    accumulation, no vLLM, no entropy bonus or masks)."""
    from accelerate import Accelerator

    stub = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1), loss_type=loss_type,
        epsilon_low=0.2, epsilon_high=epsilon_high, use_vllm=False, vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, max_completion_length=COMPLETION,
        accelerator=Accelerator(cpu=True), _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)})
    stub._get_per_token_logps_and_entropies = MethodType(GRPOTrainer._get_per_token_logps_and_entropies, stub)
    return stub


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_the_loss_and_adapter_gradients_equal_trls(policy, loss_type, beta):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(policy.config.vocab_size)
    input_ids, attention_mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    advantages = torch.tensor([1.2, -0.4, -0.8, 0.9, 0.0, -0.9])
    with torch.no_grad():
        now = completion_logps(policy, input_ids, attention_mask, COMPLETION, TEMPERATURE)
    # a rollout sampled two updates ago (ratios off 1, some past the clip) and a reference elsewhere again
    g = torch.Generator().manual_seed(2)
    old = now + 0.3 * torch.randn(now.shape, generator=g)
    ref = now + 0.2 * torch.randn(now.shape, generator=g)

    trl_inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask, "advantages": advantages, "old_per_token_logps": old,
                  "ref_per_token_logps": ref, "num_items_in_batch": completion_mask.sum()}
    theirs = GRPOTrainer._compute_loss(_trl_self(loss_type, beta, 0.28), policy, trl_inputs)
    theirs.backward()
    their_grads = _grads(policy)

    logps = completion_logps(policy, input_ids, attention_mask, COMPLETION, TEMPERATURE)
    loss = PolicyLoss(loss_type, epsilon=0.2, epsilon_high=0.28, beta=beta, max_completion_length=COMPLETION)
    ours, stats = loss(logps, advantages, completion_mask, old, ref if beta else None)
    ours.backward()
    our_grads = _grads(policy)

    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5, rel=1e-5)
    assert their_grads.keys() == our_grads.keys() and any("lora_A" in n for n in our_grads)
    for name, grad in our_grads.items():
        assert grad.abs().max() > 0, name  # a gradient that could differ
        torch.testing.assert_close(grad, their_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    assert 0 < stats["clip_ratio/region"] < 1  # the batch exercises the clip, both kept and cut tokens
    assert ("kl" in stats) == (beta > 0)


def test_group_advantages_equal_trls_for_each_scaling():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0, 2.0])  # the second group all equal: no signal
    groups = rewards.view(-1, 3)
    mean = groups.mean(1).repeat_interleave(3)
    expected = {"group": (rewards - mean) / (nanstd(groups, dim=1).repeat_interleave(3) + 1e-4),
                "batch": (rewards - mean) / (nanstd(rewards) + 1e-4), "none": rewards - mean}
    for scale, want in expected.items():
        got = group_advantages(rewards, 3, scale)
        torch.testing.assert_close(got, want)
        assert got[3:].abs().max() == 0  # the group of equal rewards: advantage 0, whatever the scale


@pytest.mark.parametrize("rewards, groups", [(torch.ones(6), 1), (torch.ones(5), 2)])
def test_rewards_that_make_no_groups_are_refused(rewards, groups):
    with pytest.raises(ValueError, match=f"num_generations={groups}"):
        group_advantages(rewards, groups)


def test_a_groups_sampling_is_a_function_of_its_seed_and_masks_after_the_end(policy):
    from llasmol.finetune.grpo import sample_group

    prompt_ids, prompt_mask, *_ = _batch(policy.config.vocab_size)
    prompt_ids, prompt_mask = prompt_ids[:2], prompt_mask[:2]
    eos = 2
    before = torch.get_rng_state()
    first = sample_group(policy, prompt_ids, prompt_mask, 3, 6, 1.0, 1.0, seed=5, eos_id=eos, pad_id=0)
    assert torch.equal(torch.get_rng_state(), before)  # the process's own random state is untouched
    again = sample_group(policy, prompt_ids, prompt_mask, 3, 6, 1.0, 1.0, seed=5, eos_id=eos, pad_id=0)
    other = sample_group(policy, prompt_ids, prompt_mask, 3, 6, 1.0, 1.0, seed=6, eos_id=eos, pad_id=0)
    ids, mask = first
    assert ids.shape[0] == 6 and mask.shape == ids.shape and ids.shape[1] <= 6
    assert torch.equal(ids, again[0]) and torch.equal(mask, again[1]) and not torch.equal(ids, other[0])
    assert len({tuple(row) for row in ids[:3].tolist()}) > 1  # a group's completions differ: something to compare
    assert torch.equal(mask, completion_mask(ids, eos))


def test_a_completion_is_learnt_through_its_first_end_and_not_after():
    completion = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 9, 2, 9], [4, 4, 4, 2]])
    assert completion_mask(completion, 2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_only_the_positions_that_predict_a_completion_token_reach_the_output_layer():
    """`logits_to_keep` where the base takes it: the output layer sees completion + 1 positions, and the
    log-probabilities are those of the whole sequence's logits."""
    from llasmol.model.base import load_base_model, load_tokenizer
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["model=tiny", "lora=lite", "lora.dropout=0"])
    model = apply_lora(load_base_model(cfg.model, load_tokenizer(cfg.model)), cfg.model, cfg.lora).eval()
    prompt_ids, prompt_mask, completion_ids, mask = _batch(model.config.vocab_size)
    input_ids, attention_mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, mask], 1)
    seen = []
    hook = model.get_base_model().lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    try:
        logps = completion_logps(model, input_ids, attention_mask, COMPLETION, TEMPERATURE)
    finally:
        hook.remove()
    assert seen == [COMPLETION + 1]
    with torch.no_grad():
        whole = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -COMPLETION - 1:-1] / TEMPERATURE
    expected = torch.log_softmax(whole.float(), -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logps.detach(), expected, rtol=1e-5, atol=1e-6)
