"""The GRPO objective's arithmetic equals TRL's GRPOTrainer (trl, a test dependency), run with TRL's own defaults
(a `GRPOConfig` with only the setting under test changed): on a fixed batch (prompts, completions of unequal
lengths narrower than the configured maximum, their masks, advantages, old and reference log-probabilities) the
loss and every adapter gradient equal those of TRL's own `_compute_loss`, for each loss type and importance
sampling level, with and without the KL term, and over two micro-batches of one optimizer step."""

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


def policy_loss(**changed) -> PolicyLoss:
    """The loss of conf/objective/grpo.yaml's defaults (TRL's, where TRL has the setting), `changed` set."""
    return PolicyLoss.of({**compose_config(["objective=grpo", "paths.output_dir=/unused"]).objective, **changed})


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


MAX_COMPLETION = COMPLETION + 3  # the configured maximum, wider than the batch: dr_grpo divides by it, not the width


def _trl_self(loss_type: str, beta: float, epsilon_high: float, level: str = "token", accumulation: int = 1,
              tmp_path="/tmp/llasmol-trl-config"):
    """What TRL's `_compute_loss` reads of its trainer, set from a `GRPOConfig` of TRL's defaults as its
    `GRPOTrainer.__init__` sets them, with only the settings under test given (one process)."""
    from accelerate import Accelerator
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), loss_type=loss_type, beta=beta, epsilon_high=epsilon_high,
                      importance_sampling_level=level, max_completion_length=MAX_COMPLETION, num_generations=GROUP,
                      per_device_train_batch_size=2 * GROUP, gradient_accumulation_steps=accumulation, use_cpu=True,
                      report_to=[])
    stub = SimpleNamespace(
        args=args, beta=args.beta, loss_type=args.loss_type, importance_sampling_level=args.importance_sampling_level,
        epsilon_low=args.epsilon, epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        top_entropy_quantile=args.top_entropy_quantile, off_policy_mask_threshold=args.off_policy_mask_threshold,
        use_vllm=args.use_vllm, vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        max_completion_length=args.max_completion_length, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=accumulation, accelerator=Accelerator(cpu=True),
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics={"train": defaultdict(list)})
    assert args.use_bias_correction_kl and args.delta is None and args.entropy_coef == 0  # TRL's defaults, kept
    stub._get_per_token_logps_and_entropies = MethodType(GRPOTrainer._get_per_token_logps_and_entropies, stub)
    return stub


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return grads


def _rollout(policy):
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
    return input_ids, attention_mask, completion_mask, advantages, old, ref, trl_inputs


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_loss_and_adapter_gradients_equal_trls(policy, loss_type, beta, level, tmp_path):
    input_ids, attention_mask, completion_mask, advantages, old, ref, trl_inputs = _rollout(policy)
    trl_self = _trl_self(loss_type, beta, 0.28, level, tmp_path=tmp_path)
    theirs = GRPOTrainer._compute_loss(trl_self, policy, trl_inputs)
    theirs.backward()
    their_grads = _grads(policy)

    logps = completion_logps(policy, input_ids, attention_mask, COMPLETION, TEMPERATURE)
    loss = policy_loss(loss_type=loss_type, epsilon=0.2, epsilon_high=0.28, beta=beta, max_new_tokens=MAX_COMPLETION,
                       importance_sampling_level=level)  # use_bias_correction_kl: TRL's default, ours
    ours, stats = loss(logps, advantages, completion_mask, old, ref if beta else None)
    if loss_type == "dapo":  # the micro-batch's sum, divided by the step's tokens once they are known
        ours = ours / completion_mask.sum()
    ours.backward()
    our_grads = _grads(policy)

    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5, rel=1e-5)
    assert their_grads.keys() == our_grads.keys() and any("lora_A" in n for n in our_grads)
    for name, grad in our_grads.items():
        assert grad.abs().max() > 0, name  # a gradient that could differ
        torch.testing.assert_close(grad, their_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    logged = {name: values[-1] for name, values in trl_self._metrics["train"].items()}
    for ours_name, trl_name in (("clip_ratio/low", "clip_ratio/low_mean"), ("clip_ratio/high", "clip_ratio/high_mean"),
                                ("clip_ratio/region", "clip_ratio/region_mean"), ("kl", "kl")):
        if trl_name in logged:
            assert stats[ours_name] == pytest.approx(logged[trl_name], abs=1e-6), ours_name
    assert ("kl" in stats) == (beta > 0) == ("kl" in logged)
    if level == "token":
        assert 0 < stats["clip_ratio/region"] < 1  # the batch exercises the clip, both kept and cut tokens


def test_the_kl_bias_correction_changes_the_gradient_as_trls_does(policy, tmp_path):
    """TRL's default multiplies the KL by the ratio; without it the gradients differ (the flag is no switched-off
    difference: both settings equal TRL's same setting)."""
    input_ids, attention_mask, completion_mask, advantages, old, ref, trl_inputs = _rollout(policy)
    grads = {}
    for corrected in (True, False):
        trl_self = _trl_self("grpo", 0.04, 0.28, tmp_path=tmp_path)
        trl_self.args.use_bias_correction_kl = corrected
        GRPOTrainer._compute_loss(trl_self, policy, trl_inputs).backward()
        theirs = _grads(policy)
        logps = completion_logps(policy, input_ids, attention_mask, COMPLETION, TEMPERATURE)
        policy_loss(loss_type="grpo", epsilon_high=0.28, beta=0.04, use_bias_correction_kl=corrected)(
            logps, advantages, completion_mask, old, ref)[0].backward()
        grads[corrected] = _grads(policy)
        for name, grad in grads[corrected].items():
            torch.testing.assert_close(grad, theirs[name], atol=1e-5, rtol=1e-4, msg=name)
    assert any(not torch.allclose(grads[True][n], grads[False][n], rtol=1e-3) for n in grads[True])


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "dapo"])
def test_two_micro_batches_of_one_step_equal_trls_gradient_accumulation(policy, loss_type, tmp_path):
    """One optimizer step over two micro-batches of unequal token counts (accumulation 2): Lightning divides each
    micro-batch's loss by 2, and `dapo`'s sums are then divided by the step's tokens (`on_before_optimizer_step`);
    TRL's `_compute_loss` is called on each half with the whole generation batch's token count."""
    input_ids, attention_mask, completion_mask, advantages, old, ref, trl_inputs = _rollout(policy)
    halves = [slice(0, GROUP), slice(GROUP, 2 * GROUP)]
    assert completion_mask[halves[0]].sum() != completion_mask[halves[1]].sum()  # uneven: a per-half mean differs
    trl_self = _trl_self(loss_type, 0.0, 0.28, accumulation=2, tmp_path=tmp_path)
    for half in halves:
        part = {k: (v[half] if k != "num_items_in_batch" else v) for k, v in trl_inputs.items()}
        GRPOTrainer._compute_loss(trl_self, policy, part).backward()
    theirs = _grads(policy)
    loss = policy_loss(loss_type=loss_type, epsilon_high=0.28, max_new_tokens=MAX_COMPLETION)
    for half in halves:
        logps = completion_logps(policy, input_ids[half], attention_mask[half], COMPLETION, TEMPERATURE)
        (loss(logps, advantages[half], completion_mask[half], old[half])[0] / 2).backward()  # Lightning's division
    if loss_type == "dapo":
        for p in policy.parameters():
            if p.grad is not None:
                p.grad.mul_(2 / completion_mask.sum())  # GRPOLoRA.on_before_optimizer_step, one process
    ours = _grads(policy)
    for name, grad in ours.items():
        torch.testing.assert_close(grad, theirs[name], atol=1e-5, rtol=1e-4, msg=name)


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


def test_the_sampling_settings_reach_generate_as_given():
    """transformers' global default top_k=50 would cut sampling while the loss is taken over the whole vocabulary:
    every setting of the objective is what `generate` receives."""
    seen = {}

    class Spy(torch.nn.Module):
        def generate(self, **kwargs):
            seen.update(kwargs)
            ids = kwargs["input_ids"]
            return torch.cat([ids, torch.full((ids.size(0), 3), 2)], 1)

    from llasmol.finetune.grpo import sample_group

    ids, mask = torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)
    completion, completion_mask_ = sample_group(Spy(), ids, mask, 3, 7, 0.7, 0.9, seed=5, eos_id=2, pad_id=0)
    assert {k: seen[k] for k in ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "num_beams",
                                 "eos_token_id", "pad_token_id", "synced_gpus")} == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_new_tokens": 7, "num_beams": 1,
        "eos_token_id": 2, "pad_token_id": 0, "synced_gpus": False}
    assert seen["input_ids"].shape == (6, 4) and completion.shape == (6, 3)  # each prompt repeated for its group
    assert completion_mask_.tolist() == [[1, 0, 0]] * 6  # through the first end only


def test_the_token_entropies_equal_trls_at_the_sampling_temperature(policy, tmp_path):
    """`train/entropy` is the masked mean of these: each completion position's entropy equals TRL's
    (`_get_per_token_logps_and_entropies`, its logits divided by the same temperature), the log-probabilities too."""
    input_ids, attention_mask, completion_mask, *_ = _rollout(policy)
    trl_self = _trl_self("dapo", 0.0, 0.28, tmp_path=tmp_path)
    with torch.no_grad():
        their_logps, their_entropies, _ = trl_self._get_per_token_logps_and_entropies(
            policy, input_ids, attention_mask, COMPLETION, compute_entropy=True)
        logps, entropies = completion_logps(policy, input_ids, attention_mask, COMPLETION, TEMPERATURE, entropy=True)
    kept = completion_mask.bool()  # TRL leaves the positions after a completion's end unset
    torch.testing.assert_close(logps[kept], their_logps[kept], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropies[kept], their_entropies[kept], atol=1e-5, rtol=1e-5)
    assert float(entropies[kept].std()) > 0.01  # positions that differ: a constant would pass an equality of means
