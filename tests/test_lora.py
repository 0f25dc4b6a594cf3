"""Which modules get adapters for each `lora` group, and the paper's parameter counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import HANG_TIMEOUT, compose_config
from refusals import refused

from llasmol.model.base import arch_config
from llasmol.model.lora import apply_lora, modules_with_adapters
from llasmol.analysis.paper import PAPER_TRAINABLE
from llasmol.model.counting import count_trainable

# A tiny in-process model of each family the paper uses (Mistral; Llama 2 / Code Llama; Galactica = OPT).
FAMILIES = {
    "mistral": ("mistral-7b", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64)),
    "llama2": ("llama2-7b", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, vocab_size=64)),
    "galactica": ("galactica-6.7b", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                         word_embed_proj_dim=32, vocab_size=64)),
}
LLAMA_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
               "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
OPT_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
             "o": "self_attn.out_proj", "up": "fc1", "down": "fc2"}
GROUP_ROLES = {
    "lite": ["q", "v"],
    "attn": ["q", "k", "v", "o"],
    "ffn": ["gate", "up", "down"],
    "full": ["q", "k", "v", "o", "gate", "up", "down"],
    "plus": ["q", "k", "v", "o", "gate", "up", "down"],
}


def tiny_peft_model(family: str, lora: str):
    cfg = compose_config([f"model={family}", f"lora={lora}", "paths.output_dir=/tmp/unused"])
    arch, dims = FAMILIES[family]
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(arch_config(arch, **dims))
    return apply_lora(base, cfg.model, cfg.lora)


def expected_modules(family: str, lora: str) -> set[str]:
    if family == "galactica":
        prefix, names = "base_model.model.model.decoder.layers", OPT_NAMES
    else:
        prefix, names = "base_model.model.model.layers", LLAMA_NAMES
    return {f"{prefix}.{layer}.{names[role]}" for layer in range(2) for role in GROUP_ROLES[lora] if role in names}


@pytest.mark.parametrize("lora", list(GROUP_ROLES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_exactly_the_named_modules_get_adapters(family, lora):
    model = tiny_peft_model(family, lora)
    assert modules_with_adapters(model) == expected_modules(family, lora)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapter_params = {n for n in trainable if ".lora_A." in n or ".lora_B." in n}
    assert len(adapter_params) == 2 * len(expected_modules(family, lora))
    head_params = trainable - adapter_params
    if lora == "plus":
        # The output head is trained as a saved copy; the original stays frozen.
        assert head_params and all(n.startswith("base_model.model.lm_head.modules_to_save.") for n in head_params)
    else:
        assert head_params == set()


def test_large_adapts_what_full_adapts_on_llama2_13b():
    cfg = compose_config(["lora=large", "paths.output_dir=/tmp/unused"])
    assert cfg.model.name == "llama2_13b" and cfg.lora.name == "large"
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(arch_config(cfg.model.arch, **FAMILIES["llama2"][1]))
    model = apply_lora(base, cfg.model, cfg.lora)
    assert modules_with_adapters(model) == expected_modules("llama2", "full")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)


def test_galactica_ffn_has_no_gate_and_adapts_fc1_fc2():
    model = tiny_peft_model("galactica", "ffn")
    assert {name.rsplit(".", 1)[1] for name in modules_with_adapters(model)} == {"fc1", "fc2"}


# The paper's Section 5.4 table (trainable parameters in millions, percent of all parameters).
PAPER = [
    ("llama2", "lite", 8.4, 0.12),
    ("llama2", "attn", 16.8, 0.25),
    ("llama2", "ffn", 23.2, 0.34),
    ("llama2", "full", 40.0, 0.59),
    ("llama2", "plus", 171.0, 2.48),
    ("llama2_13b", "large", 62.6, 0.48),
    ("mistral", "full", 41.9, 0.58),
]


@pytest.mark.parametrize("model,lora,millions,percent", PAPER)
def test_meta_device_counts_reproduce_the_paper(model, lora, millions, percent):
    counts = count_trainable(compose_config([f"model={model}", f"lora={lora}"], config_name="params"))
    assert round(counts["trainable"] / 1e6, 1) == millions
    assert round(counts["percent"], 2) == percent
    if model != "mistral":  # the report's copy of the paper's figures (Section 5.4 is on Llama 2) agrees
        assert PAPER_TRAINABLE[lora] == {"trainable": pytest.approx(millions * 1e6), "percent": percent}


@pytest.mark.parametrize("model", ["tiny", "mistral", "galactica", "gemma2"])  # own vocab; Llama; OPT; tied head
def test_params_sums_the_adapters_as_peft_adds_them(model):
    """`params` counts a bundled base's adapters without PEFT (r x (in + out) per adapted projection, a copy of
    the head for `plus`): for every LoRA variant, the counts of the model PEFT builds."""
    from llasmol.model.lora import apply_lora, count_parameters, count_with_adapters
    from llasmol.model.counting import meta_base

    for lora in ("lite", "attn", "ffn", "full", "plus"):
        cfg = compose_config([f"model={model}", f"lora={lora}"], config_name="params")
        with torch.device("meta"):
            summed = count_with_adapters(meta_base(cfg), cfg.model, cfg.lora)
            assert summed == count_parameters(apply_lora(meta_base(cfg), cfg.model, cfg.lora)), (model, lora)


def test_exact_llama2_full_count():
    counts = count_trainable(compose_config(["model=llama2", "lora=full"], config_name="params"))
    # 32 layers × r=16 × (4 attention projections of 4096→4096 + 3 FFN projections 4096↔11008)
    assert counts["trainable"] == 32 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008))
    assert counts["total"] == 6_738_415_616 + counts["trainable"]


def test_meta_device_counts_of_the_tiny_model_equal_the_built_models():
    """The tiny model's vocabulary is its bundled tokenizer's, not its config's: the meta count must be the
    count of the model training builds."""
    from llasmol.model.base import load_base_model, load_tokenizer
    from llasmol.model.lora import count_parameters

    cfg = compose_config(["model=tiny"], config_name="params")
    built = load_base_model(cfg.model, load_tokenizer(cfg.model))
    base = count_parameters(built)["total"]
    assert count_trainable(cfg) == {**count_parameters(apply_lora(built, cfg.model, cfg.lora)), "base": base}


@pytest.mark.slow
def test_params_command_prints_json_last(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "llasmol.params", "model=mistral", "lora=full"],
        capture_output=True, text=True, cwd=tmp_path, timeout=HANG_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["trainable"] == 41_943_040
    assert round(last["percent"], 2) == 0.58
    assert list(tmp_path.iterdir()) == []  # counting writes no run folder


def test_tiny_random_base_is_rebuilt_identically():
    from llasmol.model.base import load_base_model, load_tokenizer

    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    tok = load_tokenizer(cfg.model)
    first = load_base_model(cfg.model, tok).state_dict()
    torch.rand(100)  # unrelated random draws must not change the base
    second = load_base_model(cfg.model, tok).state_dict()
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key])


# Module names of each family's block as transformers names them, and the roles they play.
SCHEME_NAMES = {
    "bloom": (["self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"],
              {"q": "self_attention.query_key_value", "k": "self_attention.query_key_value",
               "v": "self_attention.query_key_value", "o": "self_attention.dense", "gate": None,
               "up": "mlp.dense_h_to_4h", "down": "mlp.dense_4h_to_h"}),
    "gpt_neox": (["attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"],
                 {"q": "attention.query_key_value", "k": "attention.query_key_value",
                  "v": "attention.query_key_value", "o": "attention.dense", "gate": None,
                  "up": "mlp.dense_h_to_4h", "down": "mlp.dense_4h_to_h"}),
    "mpt": (["attn.Wqkv", "attn.out_proj", "ffn.up_proj", "ffn.down_proj"],
            {"q": "attn.Wqkv", "k": "attn.Wqkv", "v": "attn.Wqkv", "o": "attn.out_proj", "gate": None,
             "up": "ffn.up_proj", "down": "ffn.down_proj"}),
    "gptj": (["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.fc_in", "mlp.fc_out"],
             {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "gate": None, "up": "fc_in",
              "down": "fc_out"}),
    "phi": (["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.dense", "mlp.fc1", "mlp.fc2"],
            {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "self_attn.dense", "gate": None, "up": "fc1",
             "down": "fc2"}),
    "starcoder2": (["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.c_fc",
                    "mlp.c_proj"],
                   {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": None, "up": "mlp.c_fc",
                    "down": "mlp.c_proj"}),
}


@pytest.mark.parametrize("family", list(SCHEME_NAMES))
def test_each_known_naming_scheme_gives_its_role_map(family):
    from llasmol.model.roles import infer_role_map

    names, expected = SCHEME_NAMES[family]
    assert infer_role_map(names, family) == expected


def test_names_that_fit_two_schemes_are_refused_naming_both():
    from llasmol.model.roles import infer_role_map

    names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.out_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "fc1", "fc2"]
    with refused("model.lora_targets", "llama, opt in conf/model_family/roles",
                 "of m are self_attn.q_proj, "):
        infer_role_map(names, "m")
    with refused("model.lora_targets", "of m are none"):
        infer_role_map([], "m")


def test_linear_layer_names_are_a_blocks_own_without_the_head():
    from llasmol.model.roles import linear_layer_names

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.act, self.o_proj = torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])
            self.lm_head = torch.nn.Linear(2, 3)
            self.out = torch.nn.Module()
            self.out.lm_head = torch.nn.Linear(2, 3)
            self.score = torch.nn.Linear(2, 1)

    assert linear_layer_names(Model()) == ["q_proj", "o_proj", "score"]
    assert linear_layer_names(Model(), head="score") == ["q_proj", "o_proj", "lm_head", "out.lm_head"]


def test_count_parameters_counts_adapters_in_the_total_to_four_decimals():
    from llasmol.model.lora import count_parameters

    layer = torch.nn.Linear(2, 1)  # 2 weights, 1 bias
    layer.bias.requires_grad_(False)
    assert count_parameters(layer) == {"trainable": 2, "total": 3, "percent": 66.6667}


def test_an_adapter_names_its_base_the_folder_then_the_hub_id():
    from omegaconf import OmegaConf

    from llasmol.model.lora import TINY_BASE, base_name

    tiny = base_name(OmegaConf.create({"random_init": True, "path": "/x", "hf_id": "a/b", "arch": "tiny-qwen3",
                                       "init_seed": 7}))
    assert tiny == "llasmol/tiny-qwen3 (random weights, rebuilt from model.init_seed=7)"
    assert TINY_BASE.fullmatch(tiny).group("arch", "seed") == ("tiny-qwen3", "7")
    assert base_name(OmegaConf.create({"random_init": False, "path": "/models/b", "hf_id": "a/b"})) == "/models/b"
    assert base_name(OmegaConf.create({"path": None, "hf_id": "a/b"})) == "a/b"


def test_peft_refusing_a_module_is_one_line_with_its_reason_cut_at_300_characters(monkeypatch):
    import peft

    def refuse(model, config):
        raise ValueError("Target module\n  x " + "y" * 400)

    monkeypatch.setattr(peft, "get_peft_model", refuse)
    cfg = compose_config(["model=mistral", "lora=lite", "paths.output_dir=/tmp/unused"])
    reason = ("Target module x " + "y" * 400)[:300]  # whitespace collapsed, then cut
    class Base(torch.nn.Module):  # has the modules named, so PEFT is asked (and refuses)
        def __init__(self):
            super().__init__()
            self.q_proj, self.v_proj = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    with refused("['q_proj', 'v_proj']", cfg.model.name, f"({reason})", "model.lora_targets"):
        apply_lora(Base(), cfg.model, cfg.lora)


def test_applying_lora_shows_no_deprecation_the_user_cannot_act_on():
    """PEFT asks transformers for `is_gradient_checkpointing`, which this release deprecates: not the user's
    to fix, so not shown."""
    import warnings

    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from llasmol.model.lora import lora_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_peft_model("mistral", "lite")
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    # The control: PEFT itself, asked without the filter, does warn with these releases (else nothing is shown)
    cfg = compose_config(["model=mistral", "lora=lite", "paths.output_dir=/tmp/unused"])
    arch, dims = FAMILIES["mistral"]
    with warnings.catch_warnings(record=True) as bare:
        warnings.simplefilter("always")
        get_peft_model(AutoModelForCausalLM.from_config(arch_config(arch, **dims)), lora_config(cfg.model, cfg.lora))
    if not [w for w in bare if "is_gradient_checkpointing" in str(w.message)]:
        pytest.skip("this PEFT/transformers pair no longer warns: nothing for the filter to hide")


@pytest.mark.parametrize("model", ["tiny", "mistral"])
def test_a_role_mapped_to_a_module_the_base_lacks_is_one_line_not_a_smaller_count(model):
    """PEFT would adapt the names that match and skip the rest: a misspelt map would count and train less."""
    from llasmol.model.counting import count_trainable

    cfg = compose_config(["paths.output_dir=/x", f"model={model}", "model.lora_targets.q=bogus_proj"])
    with refused("model.lora_targets.q=bogus_proj", model, "self_attn.q_proj"):
        count_trainable(cfg)

