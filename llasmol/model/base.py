"""Build or load base causal LMs.

Every supported base model ships its Hugging Face `config.json` facts in `llasmol/model/arch/`, so shapes
and parameter counts are known offline (on the `meta` device); a base that is not listed (`model=hf`) names
its local folder as `model.arch`, whose own config.json gives them. Real weights come from `model.path` or the
Hugging Face cache/Hub; when neither has them the user gets one line saying how to point at local weights.
The tiny model is built from its bundled config with random weights and uses the bundled tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from llasmol.core import offline  # its functions are looked up at each call, so a test can stand in for the Hub
from llasmol.core.config import PACKAGE_DIR
from llasmol.core.errors import UserError
from llasmol.core.files import read_json
from llasmol.model.deferred import (INDEX_FILE, DeferredWeights, check_finite, parameters_on_meta, weight_entries,
                                    weight_files)
from llasmol.model.lora import is_demo_base
from llasmol.model.memory import DTYPE_BYTES, check_dtype

ARCH_DIR = PACKAGE_DIR / "model" / "arch"
TINY_TOKENIZER_DIR = PACKAGE_DIR / "model" / "tiny_tokenizer"

_DTYPES = {name: getattr(torch, name) for name in DTYPE_BYTES}  # the dtype names, and their bytes, are memory's


def _arch_folder(arch: str) -> Optional[Path]:
    """The folder `arch` names when it is a path rather than a bundled architecture (model=hf: model.path)."""
    return Path(arch) if "/" in arch or Path(arch).is_dir() else None


def arch_facts(arch: str) -> dict[str, Any]:
    """The `config.json` facts of architecture `arch`: a file stem in `llasmol/model/arch/`, or a folder
    holding the base's own config.json."""
    folder = _arch_folder(arch)
    path = ARCH_DIR / f"{arch}.json" if folder is None else folder / "config.json"
    if folder is not None and not path.is_file():
        raise UserError(f"{arch} has no config.json: point model.path (model=hf) at the base's folder, with its "
                        "config.json, tokenizer files and *.safetensors (`hf download <id> --local-dir <folder>`)")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in ARCH_DIR.glob("*.json")))
        raise UserError(f"unknown model.arch {arch!r}: bundled architectures are {known} (or model=hf "
                        "model.path=<folder with config.json>)")
    facts = read_json(path, "copy the base's config.json again", kind=None)
    if not isinstance(facts, dict) or not isinstance(facts.get("model_type"), str):
        raise UserError(f"{path} names no model_type: copy the base's config.json again")
    for section in (facts, facts.get("text_config")):
        _check_sizes(section, path)
    return facts


# The sizes a base is built from, and the most any real one has by far (the largest bases have ~100 layers,
# hidden sizes of ~16k, ~260k-token vocabularies and 10M-token contexts): past these a config.json is damaged
# or hostile, and building even its meta-device model would take minutes or overflow.
SIZE_BOUNDS = {"hidden_size": 1 << 20, "intermediate_size": 1 << 22, "num_hidden_layers": 1 << 12,
               "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12, "head_dim": 1 << 14,
               "vocab_size": 1 << 24, "max_position_embeddings": 1 << 28, "ffn_dim": 1 << 22,
               "n_embd": 1 << 20, "n_layer": 1 << 12, "n_head": 1 << 12, "n_positions": 1 << 28}


def _check_sizes(section, path: Path) -> None:
    if not isinstance(section, dict):
        return
    for key, bound in SIZE_BOUNDS.items():
        value = section.get(key)
        if value is None:
            continue  # absent or null: the architecture's default
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            raise UserError(f"{path} has {key}={json.dumps(value)[:40]}, which must be a whole number from 1 to "
                            f"{bound}: copy the base's config.json again")
    # Heads split the width: without an explicit head_dim each head is width / heads wide, and grouped-query
    # attention shares each key/value head among a whole number of query heads.
    for width, heads in (("hidden_size", "num_attention_heads"), ("n_embd", "n_head")):
        if section.get("head_dim") is None and section.get(width) and section.get(heads) and \
                section[width] % section[heads]:
            raise UserError(f"{path} has {width}={section[width]} and {heads}={section[heads]}: without a head_dim "
                            f"each head is {width} / {heads} wide, which must be a whole number: copy the base's "
                            "config.json again")
    heads, shared = section.get("num_attention_heads"), section.get("num_key_value_heads")
    if heads and shared and heads % shared:
        raise UserError(f"{path} has num_attention_heads={heads} and num_key_value_heads={shared}: each key/value "
                        "head serves a whole number of attention heads: copy the base's config.json again")


def arch_is_bundled(arch: str) -> bool:
    """Whether `arch` is one of the bundled architectures (not a folder's config.json)."""
    return _arch_folder(arch) is None


def arch_config(arch: str, **overrides: Any):
    """The `transformers` config of architecture `arch` (bundled facts, or a folder's config.json)."""
    from transformers import AutoConfig

    facts = {**arch_facts(arch), **overrides}
    if _arch_folder(arch) is not None:
        try:  # transformers reads its own file (renamed keys, nested sub-configs) as it would load the weights
            return AutoConfig.from_pretrained(arch, **overrides)
        except (OSError, ValueError, KeyError) as err:
            reason = " ".join(str(err).split())[:200]
            raise UserError(f"{arch}/config.json cannot be read by transformers ({reason}): a model_type this "
                            "transformers release knows is needed") from None
    return AutoConfig.for_model(facts.pop("model_type"), **facts)


# Families whose attention follows restarting position ids when no 2-D mask is given (data.packing).
# OPT/Galactica derives its learned positions from the attention mask instead, so it cannot pack.
PACKING_MODEL_TYPES = ("llama", "mistral")


def check_packing(model_cfg) -> None:
    model_type = arch_config(model_cfg.arch).model_type  # bundled facts: no download, unknown arch named
    if model_type not in PACKING_MODEL_TYPES:
        why = ("whose positions come from the attention mask" if model_type == "opt"
               else "whose packed attention is not yet checked against padded batches")
        raise UserError(
            f"data.packing=true needs a Llama- or Mistral-family base; model={model_cfg.name} is {model_type}, "
            f"{why}: set data.packing=false"
        )


def torch_dtype(name: str, key: str = "model.dtype") -> torch.dtype:
    return _DTYPES[check_dtype(name, key)]


def _weights_source(model_cfg) -> str:
    return model_cfg.get("path") or model_cfg.hf_id


def _local_only(model_cfg, what: str) -> bool:
    """True when the Hub is out of reach and the files are cached (load them without asking the Hub);
    a one-line error when they are not cached either; False when the Hub may be asked."""
    if model_cfg.get("path") or (model_cfg.hf_id and Path(model_cfg.hf_id).is_dir()):
        return False  # a local folder: nothing to ask the Hub
    reason = offline.hub_unreachable()
    if reason is None:
        return False
    if not offline.cached_on_disk(model_cfg.hf_id):
        raise _offline_error(model_cfg, what, reason)
    return True


def check_base_reachable(model_cfg) -> None:
    """The one-line error `load_tokenizer` would give, now: a base that is neither local, nor cached, nor on a
    reachable Hub (`train` asks before it imports Lightning, some 4 s, so the line comes at once)."""
    if not (model_cfg.get("random_init") or model_cfg.get("tokenizer") == "tiny"):
        _local_only(model_cfg, "the tokenizer files")


def _load_error(model_cfg, what: str, err: Exception) -> UserError:
    """What loading `what` failed for: a base whose own code transformers will not run untrusted, or files that
    are not there (the offline message)."""
    if "trust_remote_code" in str(err) and not model_cfg.get("trust_remote_code"):
        return UserError(f"{model_cfg.get('hf_id') or model_cfg.get('path')} needs its own modelling code to load "
                         f"{what}, which transformers runs only when trusted: read its code, then set "
                         "model.trust_remote_code=true (it runs as you)")
    return _offline_error(model_cfg, what)


def _offline_error(model_cfg, what: str, reason: Optional[str] = None) -> UserError:
    if model_cfg.get("path"):
        return UserError(
            f"{what} of {model_cfg.hf_id} not found at model.path={model_cfg.path}: point model.path at a folder "
            "with config.json, tokenizer files and *.safetensors"
        )
    why = f"; {reason}" if reason else ""
    return UserError(
        f"{what} of {model_cfg.hf_id} are not available offline (not in the Hugging Face cache and no "
        f"model.path{why}): run `hf download {model_cfg.hf_id}` where the Hub is reachable (Llama, Mistral and Gemma "
        "are gated: accept the licence on the model's Hub page and `hf auth login` first), or set "
        "model.path=<local folder with the weights>"
    )


def load_tokenizer(model_cfg):
    """The tokenizer of the base model; the tiny model's ships with the package."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if model_cfg.get("tokenizer") == "tiny":
        return PreTrainedTokenizerFast.from_pretrained(str(TINY_TOKENIZER_DIR))
    local_only = _local_only(model_cfg, "the tokenizer files")
    legacy = model_cfg.tokenizer_legacy  # true, false or null: the schema has checked it
    try:
        tok = AutoTokenizer.from_pretrained(
            _weights_source(model_cfg),
            trust_remote_code=model_cfg.trust_remote_code,
            local_files_only=local_only,
            # Beside a tekken.json transformers would pick mistral_common's backend, which reads `<s>` in
            # text as three characters: the paper's string needs its special tokens matched in text.
            mistral_format=False,
            **({} if legacy is None else {"legacy": legacy}),
        )
    except (OSError, ValueError) as err:
        raise _load_error(model_cfg, "the tokenizer files", err) from err
    if legacy is not None:
        _check_legacy_encoding(tok, legacy, model_cfg)
    complete_special_tokens(tok, arch_facts(model_cfg.arch))
    if tok.pad_token_id is None:
        # Llama-family tokenizers have no pad token; padding positions never reach the loss anyway.
        tok.pad_token = tok.unk_token or tok.eos_token
    return tok


def _check_legacy_encoding(tok, legacy: bool, model_cfg) -> None:
    """The paper's prompt starts '<s>[INST]'; a legacy SentencePiece tokenizer (as the 2024 runs had) encodes
    the '[' after '<s>' as '▁[', a non-legacy one as '['. Adapters trained one way see other prompts the
    other way, so the encoding is checked, not assumed: a tokenizer that ignores the setting is one line."""
    pieces = tok.convert_ids_to_tokens(tok("<s>[INST]", add_special_tokens=False)["input_ids"])
    want = "\u2581[" if legacy else "["
    if len(pieces) < 2 or pieces[1] != want:
        raise UserError(
            f"the tokenizer of {model_cfg.get('hf_id')} encodes '<s>[INST]' as {pieces[:3]}, not with {want!r} after "
            f"'<s>' as model.tokenizer_legacy={str(legacy).lower()} asks (the encoding the released LlaSMol models "
            "were trained with): use a SentencePiece tokenizer that honours `legacy`, or model.tokenizer_legacy=null "
            "to take the files' own encoding"
        )


def complete_special_tokens(tok, facts: dict[str, Any]) -> None:
    """Name the BOS, EOS and pad tokens a tokenizer's files leave out, by the ids of the base's config.json.

    Galactica's tokenizer adds no BOS and may name no EOS or pad token, though its config.json says
    bos 0, eos 2, pad 1; the paper's format `<s>[INST] ... </s>` needs both ends for every base.
    """
    for role in ("bos", "eos", "pad"):
        token_id = facts.get(f"{role}_token_id")
        if getattr(tok, f"{role}_token") is None and isinstance(token_id, int) and 0 <= token_id < len(tok):
            # An existing vocabulary entry becomes special: no new id, and it is matched whole in text.
            tok.add_special_tokens({f"{role}_token": tok.convert_ids_to_tokens(token_id)})


def build_meta_model(model_cfg, vocab_size: Optional[int] = None):
    """The model's modules on the `meta` device: exact shapes and counts, no memory, no download."""
    from transformers import AutoModelForCausalLM

    overrides = {"vocab_size": vocab_size} if vocab_size else {}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(arch_config(model_cfg.arch, **overrides))


def quantization_config(quant_cfg):
    """bitsandbytes settings for `quantization=8bit|4bit`; None for `none`. The settings come checked
    (`core.schema.QuantizationSchema`: the bits, the 4-bit data type, a 4-bit base's every setting).

    bitsandbytes (>= 0.49) runs its 4-bit and 8-bit layers and its 8-bit optimizers on a CPU as well as on
    CUDA, so a quantised base needs no GPU: only paged optimizers do (the config check says so).
    """
    bits = quant_cfg.get("bits") if quant_cfg else None
    if bits is None:
        return None
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant_cfg["quant_type"],
        bnb_4bit_use_double_quant=quant_cfg["double_quant"],
        bnb_4bit_compute_dtype=torch_dtype(quant_cfg["compute_dtype"], "quantization.compute_dtype"),
    )


def _random_base(model_cfg, tokenizer, dtype: torch.dtype):
    """The tiny model's base: random weights from its own seed, whatever else consumed random numbers
    before, so evaluating an adapter rebuilds the very same base (it is never saved with a run)."""
    from transformers import AutoModelForCausalLM

    config = arch_config(model_cfg.arch, vocab_size=len(tokenizer))
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model_cfg.init_seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _quantized_random_base(model_cfg, tokenizer, dtype: torch.dtype, quantization):
    """The tiny model's random base, quantised through the very loader a real base goes through: written
    once to a temporary folder as safetensors, then read back by `from_pretrained` with the bitsandbytes
    settings (quantising an in-memory model by hand would test another path than users run)."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    model = _random_base(model_cfg, tokenizer, dtype)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a few kB written and read back: no progress to show
    try:
        with tempfile.TemporaryDirectory(prefix="llasmol-random-base-") as folder:
            model.save_pretrained(folder, safe_serialization=True)
            del model
            return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, quantization_config=quantization,
                                                        use_safetensors=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def load_base_model(model_cfg, tokenizer, quant_cfg=None):
    """Weights for training: random for the tiny model, pretrained (in `model.dtype`, or quantised by
    `quant_cfg`) for the others."""
    from transformers import AutoModelForCausalLM

    dtype = torch_dtype(model_cfg.dtype)
    quantization = quantization_config(quant_cfg)
    if model_cfg.get("random_init"):
        if quantization is None:
            return _random_base(model_cfg, tokenizer, dtype)
        model = _quantized_random_base(model_cfg, tokenizer, dtype, quantization)
    else:
        local_only = _local_only(model_cfg, "base weights")
        try:
            model = _quietly(is_demo_base(model_cfg), AutoModelForCausalLM.from_pretrained,
                _weights_source(model_cfg),
                local_files_only=local_only,
                dtype=dtype,
                quantization_config=quantization,
                use_safetensors=True,  # never unpickle downloaded weights
                trust_remote_code=model_cfg.trust_remote_code,
            )
        except (OSError, ValueError) as err:
            raise _load_error(model_cfg, "base weights", err) from err
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        for name, param in model.named_parameters():  # one pass over the loaded weights: a damaged file is named
            check_finite(name, param.detach(), _weights_source(model_cfg))
    if quantization is not None:
        from peft import prepare_model_for_kbit_training

        # Casts norms to fp32 for stable k-bit training; checkpointing is the `gradient_checkpointing`
        # switch's business (the quantization presets turn it on, as QLoRA does).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        _one_cpu_layout(model)
    return model


def _quietly(quiet: bool, load, *args, **kwargs):
    """`load(...)` without transformers' progress bar when `quiet` (the demo base: 3 MB read in a blink, whose
    'Loading weights' bar would be the only line of a command's output that says nothing)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    if quiet and shown:
        hf_logging.disable_progress_bar()
    try:
        return load(*args, **kwargs)
    finally:
        if quiet and shown:
            hf_logging.enable_progress_bar()


def weights_folder(model_cfg) -> Path:
    """The local folder of the base's config.json and safetensors files: model.path, or the Hugging Face cache
    (filled from the Hub when it is reachable and the files are not cached yet)."""
    source = _weights_source(model_cfg)
    if Path(source).is_dir():
        return Path(source)
    local_only = _local_only(model_cfg, "base weights")
    from huggingface_hub import snapshot_download

    code = ["*.py"] if model_cfg.trust_remote_code else []  # a base's own modelling code, when it is trusted
    try:
        # The files transformers reads, not every *.safetensors: some repositories also hold a consolidated copy
        # of the weights (Mistral's: 14.5 GB more).
        folder = Path(snapshot_download(source, allow_patterns=["config.json", "generation_config.json", INDEX_FILE,
                                                                *code], local_files_only=local_only))
        return Path(snapshot_download(source, allow_patterns=weight_files(folder / INDEX_FILE),
                                      local_files_only=local_only))
    except (OSError, ValueError) as err:
        raise _load_error(model_cfg, "base weights", err) from err


def load_base_on_meta(model_cfg, tokenizer):
    """The pretrained base as `load_base_model` gives it, but with its parameters on the meta device: no memory
    until `trainer=fsdp` has sharded it and each process reads its own rows (`llasmol.model.deferred`). The
    files to read them from are named on the model as `deferred_weights`."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    folder = weights_folder(model_cfg)
    files = weight_entries(folder)  # an incomplete or damaged folder is one line now, not after the sharding
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=model_cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise _load_error(model_cfg, "base weights", err) from err
    dtype = torch_dtype(model_cfg.dtype)
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
    conversions = _conversions(model)
    _check_read_as_is(model, model_cfg, dtype, conversions)
    if (folder / "generation_config.json").is_file():  # as from_pretrained reads it
        model.generation_config = GenerationConfig.from_pretrained(folder)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    renames = tuple((source, step.target_patterns[0]) for step in conversions
                    if type(step).__name__ == "WeightRenaming" for source in step.source_patterns)
    model.deferred_weights = DeferredWeights.of(model, folder, renames, files)  # each header read once
    return model


def _conversions(model) -> list:
    """What transformers does to a checkpoint's tensors as `from_pretrained` loads them into `model` (5.x)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:  # transformers 4: keys are matched as they are
        return []
    return list(get_model_conversion_mapping(model))


def _check_read_as_is(model, model_cfg, dtype: torch.dtype, conversions: list) -> None:
    """trainer=fsdp reads each tensor as the files hold it, renamed at most: a base whose loading does more (fuses
    tensors, keeps modules in float32 under a half dtype) is one line naming trainer=ddp, which loads it whole."""
    converted = [type(step).__name__ for step in conversions if type(step).__name__ != "WeightRenaming"]
    fp32 = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        fp32 |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    if converted or (fp32 and dtype != torch.float32):
        what = f"converts its tensors as they load ({converted[0]})" if converted else \
            f"keeps {sorted(fp32)[0]} in float32 under model.dtype={model_cfg.dtype}"
        raise UserError(f"{model_cfg.get('hf_id') or model_cfg.name} {what}, which trainer=fsdp's shard-by-shard read "
                        "does not do: train it with trainer=ddp")


def _one_cpu_layout(model) -> None:
    """bitsandbytes' CPU backend repacks a 4-bit layer's weights for its AVX512-BF16 kernel at the layer's first
    forward in eval mode without gradients, and keeps them so: every step after a run's first validation then
    computes with another kernel than the steps before it, so a run resumed where no validation has happened
    yet trains otherwise than the run it continues (measured on the tiny base: step 3's loss 7.9622 resumed,
    7.9647 unstopped). One layout throughout: the repacking is turned off (the GPU kernels never repack)."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
