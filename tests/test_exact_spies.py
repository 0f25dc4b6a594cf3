"""What `generate` receives, exactly, for every sampling and beam setting the config exposes (issue #67).

transformers fills every setting a call leaves out from the model's generation config and then its own globals
(top_k=50 among them): a setting that does not reach `generate` silently changes sampling. Two levels: a spy in
place of `generate` records the keywords each command's composed config gives, task by task; on the real tiny model
a spy on transformers' `_get_logits_processor` records the generation config transformers resolved and the
warpers it built, with a base whose own generation config asks for sampling with top_k=50 and temperature 0.6 (as
chat bases ship), which our settings must override."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from llasmol.core.config import compose_config
from llasmol.core.tasks import SMOLINSTRUCT

EOS, PAD = 2, 0

# conf/generation/paper.yaml: each task's (num_beams, num_return_sequences)
BEAMS = {"forward_synthesis": (8, 5), "retrosynthesis": (13, 10), "molecule_generation": (8, 5),
         "name_conversion-i2s": (8, 5), "name_conversion-s2i": (8, 5), "name_conversion-i2f": (6, 3),
         "name_conversion-s2f": (6, 3), "molecule_captioning": (4, 1), "property_prediction-esol": (4, 1),
         "property_prediction-lipo": (4, 1), "property_prediction-bbbp": (4, 1),
         "property_prediction-clintox": (4, 1), "property_prediction-hiv": (4, 1),
         "property_prediction-sider": (4, 1)}


@functools.lru_cache(maxsize=None)
def generation_of(command: str, overrides: tuple = ()):
    extra = [] if command == "generate" else ["paths.output_dir=/unused"]
    return compose_config([*extra, *overrides], command).generation


class SpyModel(torch.nn.Module):
    """`generate` that records its keywords and answers each row with one token then the end."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def generate(self, **kwargs):
        self.calls.append(kwargs)
        ids = kwargs["input_ids"].repeat_interleave(kwargs.get("num_return_sequences", 1), dim=0)
        return torch.cat([ids, torch.tensor([[7, EOS]]).expand(ids.size(0), 2)], 1)


def ask_every_task(generation):
    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.inference.pipeline import ModelAnswers

    model = SpyModel()
    tokenizer = SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS,
                                batch_decode=lambda ids, skip_special_tokens=True: ["seven"] * len(ids))
    formatter = SimpleNamespace(prompt_ids=lambda query: [5, 6, 7])
    answers = ModelAnswers(BeamGenerator(model, tokenizer, formatter, 512, 8), generation, tasks=SMOLINSTRUCT)
    for task in ["", *SMOLINSTRUCT]:
        assert answers.ask("q", task) is not None
    return model.calls


def expected_call(beams, returned, new_tokens, early=False):
    return {"num_beams": beams, "num_return_sequences": returned, "max_new_tokens": new_tokens, "do_sample": False,
            "early_stopping": early, "pad_token_id": PAD, "eos_token_id": EOS, "synced_gpus": False}


@pytest.mark.parametrize("command, overrides, new_tokens, early, own", [
    ("train", (), 48, False, {}),  # the demo's cap (conf/generation/demo.yaml): every task, and a question
    ("evaluate", (), 48, False, {}),
    ("generate", (), 48, False, {}),
    ("evaluate", ("generation.max_new_tokens_limit=null",), 1024, False, {}),  # the paper's own
    ("evaluate", ("generation.default.early_stopping=true",), 48, True, {}),
    ("train", ("+generation.tasks.forward_synthesis.max_new_tokens=7",
               "generation.tasks.retrosynthesis.num_return_sequences=2"), 48, False,
     {"forward_synthesis": (8, 5, 7), "retrosynthesis": (13, 2, 48)}),
])
def test_each_tasks_beam_settings_reach_generate_exactly(command, overrides, new_tokens, early, own):
    calls = ask_every_task(generation_of(command, overrides))
    assert len(calls) == 1 + len(SMOLINSTRUCT)
    keys = set(expected_call(1, 1, 1))
    # one question without a task: generation.question's greedy answer (generation.default is the tasks')
    assert {k: calls[0][k] for k in keys} == expected_call(1, 1, new_tokens, False)
    for task, call in zip(SMOLINSTRUCT, calls[1:]):
        beams, returned, tokens = own.get(task, (*BEAMS[task], new_tokens))
        assert {k: call[k] for k in keys} == expected_call(beams, returned, tokens, early), task
        assert set(call) == keys | {"input_ids", "attention_mask"}, task  # nothing else: no stray sampling setting


@pytest.fixture(scope="module")
def tiny():
    """The tiny architecture with random weights, its own generation config asking for sampling as chat bases'
    do (top_k 50, temperature 0.6, top_p 0.8): what a call must override."""
    from llasmol.model.base import load_base_model, load_tokenizer

    cfg = compose_config(["model=tiny", "model.random_init=true", "paths.output_dir=/unused"])
    tokenizer = load_tokenizer(cfg.model)
    model = load_base_model(cfg.model, tokenizer).eval()
    model.generation_config.do_sample, model.generation_config.top_k = True, 50
    model.generation_config.temperature, model.generation_config.top_p = 0.6, 0.8
    return model, tokenizer


@pytest.fixture
def resolved(monkeypatch):
    """Each generate call's generation config as transformers resolved it, and the logits processors it built."""
    from transformers.generation.utils import GenerationMixin

    seen, real = [], GenerationMixin._get_logits_processor

    def spy(self, generation_config, *args, **kwargs):
        processors = real(self, generation_config, *args, **kwargs)
        seen.append((generation_config, list(processors)))
        return processors

    monkeypatch.setattr(GenerationMixin, "_get_logits_processor", spy)
    return seen


def _warpers(processors):
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper, TypicalLogitsWarper)

    kinds = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper)
    out = []
    for p in processors:
        if isinstance(p, kinds):
            value = {TemperatureLogitsWarper: "temperature", TopKLogitsWarper: "top_k",
                     TopPLogitsWarper: "top_p"}.get(type(p))
            out.append((type(p).__name__, getattr(p, value) if value else None))
    return out


@pytest.mark.parametrize("temperature, top_p, warpers", [
    (1.0, 1.0, []),  # the objective's defaults (TRL's): the whole distribution, no top-k cut of 50
    (0.7, 0.9, [("TemperatureLogitsWarper", 0.7), ("TopPLogitsWarper", 0.9)]),
    (1.3, 1.0, [("TemperatureLogitsWarper", 1.3)]),
])
def test_a_rollout_samples_with_the_objectives_settings_and_no_top_k(tiny, resolved, temperature, top_p, warpers):
    from llasmol.finetune.grpo import sample_group

    model, tokenizer = tiny
    prompts = torch.tensor([[5, 6, 7], [PAD, 8, 9]])
    mask = (prompts != PAD).long()
    completion, _ = sample_group(model, prompts, mask, 3, 5, temperature, top_p, seed=1,
                                 eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    ((config, processors),) = resolved
    assert (config.do_sample, config.num_beams, config.num_return_sequences, config.max_new_tokens, config.top_k,
            config.temperature, config.top_p) == (True, 1, 1, 5, 0, temperature, top_p)
    assert _warpers(processors) == warpers
    assert completion.shape[0] == 6 and completion.shape[1] <= 5


def test_beam_search_ignores_the_bases_sampling_settings(tiny, resolved):
    """Validation, evaluate and generate answer by beam search whatever the base's generation config says."""
    from llasmol.inference.beam_search import BeamGenerator, task_settings

    model, tokenizer = tiny
    generator = BeamGenerator(model, tokenizer, SimpleNamespace(prompt_ids=lambda q: [5, 6, 7]), 512, 8)
    settings = task_settings(generation_of("evaluate", ("generation.max_new_tokens_limit=3",)), "forward_synthesis",
                             SMOLINSTRUCT)
    (responses,) = generator.generate(["q"], settings)
    ((config, processors),) = resolved
    assert (config.do_sample, config.num_beams, config.num_return_sequences, config.max_new_tokens,
            config.early_stopping) == (False, 8, 5, 3, False)
    assert _warpers(processors) == [] and len(responses) == 5


def test_a_rollout_samples_from_the_policy_the_loss_trains_whatever_the_bases_repetition_penalty(tiny, resolved,
                                                                                                    monkeypatch):
    """A base's own generation config (Qwen2.5-Instruct ships repetition_penalty 1.05) must not reshape the
    rollouts' distribution, which the loss takes as log_softmax(logits / T): TRL passes repetition_penalty=1.0."""
    from llasmol.finetune.grpo import sample_group

    model, tokenizer = tiny
    monkeypatch.setattr(model.generation_config, "repetition_penalty", 1.05)
    sample_group(model, torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long), 2, 4, 1.0, 1.0, seed=1,
                 eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    ((config, processors),) = resolved
    assert config.repetition_penalty == 1.0 and [type(p).__name__ for p in processors] == []


# ------------------------------------------------------------------ the optimizer and its schedule


@pytest.mark.parametrize("overrides, kind, lr, decay", [
    ([], "AdamW", 3e-3, 0.0),  # the demo recipe's
    (["optimizer.lr=0.0125", "optimizer.weight_decay=0.1", "+optimizer.betas=[0.8,0.95]", "+optimizer.eps=1e-6"],
     "AdamW", 0.0125, 0.1),
    (["optimizer=adamw8bit", "optimizer.lr=0.002", "+optimizer.betas=[0.85,0.99]"], "AdamW8bit", 0.002, 0.0),
])
def test_the_optimizer_gets_the_configs_settings_and_the_adapters_alone(overrides, kind, lr, decay):
    """What `optimizer` and `scheduler` say reaches the optimizer Lightning steps: its class, lr (the schedule's
    start after warm-up), weight decay, betas and eps as given (else the library's own), and only the trainable
    parameters (the frozen base would be decayed and its moments kept: 2 x its size)."""
    from llasmol.finetune.build import build_module
    from llasmol.model.base import load_base_model, load_tokenizer
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["model.random_init=true", "paths.output_dir=/unused", "scheduler.num_warmup_steps=4",
                          *overrides])
    model = apply_lora(load_base_model(cfg.model, load_tokenizer(cfg.model)), cfg.model, cfg.lora)
    module = build_module(cfg, model)
    module.trainer = SimpleNamespace(estimated_stepping_batches=20)
    configured = module.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    assert type(optimizer).__name__ == kind and configured["lr_scheduler"]["interval"] == "step"
    (group,) = optimizer.param_groups
    given = dict(o.split("=", 1) for o in overrides)
    betas = tuple(float(b) for b in given["+optimizer.betas"].strip("[]").split(",")) if "+optimizer.betas" in given \
        else (0.9, 0.999)
    assert (group["initial_lr"], group["weight_decay"], tuple(group["betas"]), group["eps"]) == (
        lr, decay, betas, float(given.get("+optimizer.eps", 1e-8)))
    trained = [p for p in model.parameters() if p.requires_grad]
    assert [id(p) for p in group["params"]] == [id(p) for p in trained] and len(trained) < len(list(model.parameters()))
    # the cosine schedule with 4 warm-up steps of 20: 0 at the start, lr after warm-up, half lr midway through the rest
    rates = []
    for _ in range(13):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 0.0 and rates[2] == pytest.approx(lr / 2) and rates[4] == pytest.approx(lr)
    assert rates[12] == pytest.approx(lr / 2)  # step 12: half of the 16 decaying steps done


# ------------------------------------------------------------------ the sharding call


@pytest.mark.parametrize("precision, reshard", [("bf16-mixed", True), ("32-true", False)])
def test_the_sharding_call_gets_the_mesh_the_precision_and_the_resharding_the_config_gives(monkeypatch, precision,
                                                                                          reshard):
    """trainer=fsdp's strategy, built from its config, hands fully_shard the data-parallel mesh, the precision's
    mixed-precision policy and trainer.strategy.reshard_after_forward for every block (its MLP a unit of its own
    first), then the embeddings (resharded, not gathered in backward: frozen), the head (kept gathered for its
    backward) and the base as the root, in that order."""
    import hydra
    import torch.distributed.fsdp as fsdp
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from llasmol.model.base import load_base_model, load_tokenizer
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["model.random_init=true", "trainer=fsdp", "paths.output_dir=/unused",
                          f"trainer.strategy.reshard_after_forward={str(reshard).lower()}"])
    model = apply_lora(load_base_model(cfg.model, load_tokenizer(cfg.model)), cfg.model, cfg.lora)
    calls = []

    def fully_shard(module, **kwargs):
        calls.append((module, kwargs))
        module.set_unshard_in_backward = lambda flag: calls.append((module, {"unshard_in_backward": flag}))

    monkeypatch.setattr(fsdp, "fully_shard", fully_shard)
    strategy = hydra.utils.instantiate(cfg.trainer.strategy)
    mesh = SimpleNamespace(device_type="cuda")
    strategy._device_mesh, strategy._precision_plugin = {"data_parallel": mesh}, SimpleNamespace(precision=precision)
    strategy.shard(model)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16-mixed" else MixedPrecisionPolicy()
    root = model.get_base_model()
    unit = {"mesh": mesh, "mp_policy": policy}
    expected = [(part, {**unit, "reshard_after_forward": reshard})
                for block in root.model.layers for part in (block.mlp, block)]
    expected += [(root.model.embed_tokens, {**unit, "reshard_after_forward": True}),
                 (root.model.embed_tokens, {"unshard_in_backward": False}),
                 (root.lm_head, {**unit, "reshard_after_forward": False}), (root, unit)]
    assert [(id(m), kw) for m, kw in calls] == [(id(m), kw) for m, kw in expected]
    assert len(root.model.layers) == 2
