"""LoRA adapters chosen by role (q, k, v, o, gate, up, down) and mapped to each family's module names."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from llasmol.core.errors import UserError
from llasmol.model.roles import ROLES, linear_layer_names, names_target, role_map
from llasmol.model.shapes import MODULE, Shapes
# What an adapter of the embedded tiny model names as its base (it has no Hub id: its random weights are
# rebuilt from model.init_seed, never saved): its architecture and seed, which must match where it loads.
# Adapters saved before both were named carry the seedless form (`llasmol.inference.loading` reads both).
TINY_BASE = re.compile(r"llasmol/(?P<arch>[\w.-]+) \(random weights, rebuilt from model\.init_seed(=(?P<seed>\d+))?\)")
# What an adapter of the pretrained demo base names (model=tiny; its folder's place differs between installs):
# the first 12 hex digits of its weights' SHA-256, which must match where it loads.
DEMO_BASE = re.compile(r"llasmol/demo-base \(pretrained, weights sha256 (?P<digest>[0-9a-f]{12})\)")
DEMO_WEIGHTS = "model.safetensors"


def is_demo_base(model_cfg) -> bool:
    """Whether `model_cfg` is the demo base pretrained by llasmol (the tiny tokenizer, weights from model.path)."""
    return model_cfg.get("tokenizer") == "tiny" and not model_cfg.get("random_init")


@functools.lru_cache(maxsize=8)
def _digest(path: str, stamp: tuple) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:12]


def demo_weights_digest(folder) -> str:
    """The first 12 hex digits of the SHA-256 of a demo base folder's weights (a missing file is one line)."""
    path = Path(folder) / DEMO_WEIGHTS
    try:
        stat = path.stat()
    except OSError:
        raise UserError(f"{folder} has no {DEMO_WEIGHTS}: the demo base ships with llasmol (reinstall it), or "
                        "rebuild it with python scripts/pretrain_demo_base.py --out <folder>") from None
    return _digest(str(path), (stat.st_size, stat.st_mtime_ns))


def base_name(model_cfg) -> str:
    """The base an adapter records (`base_model_name_or_path`): the Hub id, the local folder, or the demo base
    (pretrained, by its weights' digest; or its random weights, by architecture and seed)."""
    if model_cfg.get("random_init"):
        return f"llasmol/{model_cfg.arch} (random weights, rebuilt from model.init_seed={model_cfg.init_seed})"
    if is_demo_base(model_cfg):
        return f"llasmol/demo-base (pretrained, weights sha256 {demo_weights_digest(model_cfg.path)})"
    return model_cfg.get("path") or model_cfg.hf_id


def target_modules(model_cfg, lora_cfg) -> list[str]:
    """Module names that get adapters: the LoRA group names roles, the model config maps them to names
    (`llasmol.model.roles.role_map`, which reads them from the base where the config leaves them out).

    A role the family does not have (OPT/Galactica has no gate projection) is skipped. A module that serves
    several roles (a fused q/k/v) is named once, and only when every role it serves is chosen.
    """
    mapping = role_map(model_cfg)
    names = list(dict.fromkeys(mapping[role] for role in lora_cfg.targets if mapping.get(role)))
    for name in names:
        serves = [role for role in ROLES if mapping.get(role) == name]
        left = [role for role in serves if role not in lora_cfg.targets]
        if left:
            raise UserError(
                f"model {model_cfg.name} computes {', '.join(serves)} in one module ({name}): lora.targets "
                f"{list(lora_cfg.targets)} must take all of them or none (add {', '.join(left)})"
            )
    if not names:
        raise UserError(f"lora.targets {list(lora_cfg.targets)} match no module of model {model_cfg.name}")
    return names


def lora_config(model_cfg, lora_cfg):
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=target_modules(model_cfg, lora_cfg),
        # `plus`: a trainable, saved copy of the output head, as PEFT's modules_to_save does it.
        modules_to_save=[model_cfg.head] if lora_cfg.get("train_head") else None,
    )


def apply_lora(model, model_cfg, lora_cfg):
    """Wrap `model` with freshly initialised adapters; only adapter (and saved-head) weights train."""
    import warnings

    from peft import get_peft_model

    from llasmol.model.deferred import adapt_meta_base  # torch at import: counting a bundled base needs none

    with warnings.catch_warnings():
        # PEFT asks for a property this transformers release deprecates; nothing for our users to do.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        config = lora_config(model_cfg, lora_cfg)
        _check_targets_exist(model, sorted(config.target_modules), model_cfg)
        try:
            if getattr(model, "deferred_weights", None) is not None:  # trainer=fsdp's base, read after sharding
                peft_model = adapt_meta_base(model, lambda base: get_peft_model(base, config))
            else:
                peft_model = get_peft_model(model, config)
        except ValueError as err:  # PEFT's word on a module name it cannot adapt (missing, or unsupported)
            reason = " ".join(str(err).split())[:300]
            raise UserError(f"LoRA cannot go on {sorted(config.target_modules)} of model {model_cfg.name} ({reason}): "
                            "fix model.lora_targets") from None
    # Saved adapters say which base they go on (PEFT takes the base's name_or_path, empty for the tiny model).
    peft_model.peft_config["default"].base_model_name_or_path = base_name(model_cfg)
    return peft_model


def _check_targets_exist(model, targets: list[str], model_cfg) -> None:
    """PEFT adapts the names that match and skips the others without a word, so a misspelt role map would
    train (and count) fewer modules than asked: every name must match a module of the base (`model`, or its
    `Shapes`)."""
    names = model.names() if isinstance(model, Shapes) else [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(names_target(n, t) for n in names)]
    if missing:
        layers = ", ".join(linear_layer_names(model, model_cfg.get("head") or "lm_head"))
        role = next(r for r, name in role_map(model_cfg).items() if name == missing[0])
        raise UserError(f"model.lora_targets.{role}={missing[0]}: model {model_cfg.name} has no module called "
                        f"{missing[0]} (its linear layers: {layers}); fix model.lora_targets")


def count_with_adapters(model, model_cfg, lora_cfg) -> dict:
    """`count_parameters` of the model `apply_lora` would make of `model`, counted without building it: PEFT
    (and the bitsandbytes it imports) costs `params` seconds for a sum. Each adapted Linear (or GPT-2 Conv1D)
    of `in` inputs and `out` outputs gains r x (in + out) trainable weights (lora_A and lora_B); `train_head`
    adds a trainable copy of the head (PEFT's modules_to_save). tests/test_lora.py holds it equal to PEFT's."""
    shapes = model if isinstance(model, Shapes) else Shapes.of(model)  # `model` may be its shapes already
    targets = target_modules(model_cfg, lora_cfg)
    _check_targets_exist(shapes, sorted(targets), model_cfg)
    added = 0
    for part in shapes.parts:
        if not any(names_target(part.name, t) for t in targets):
            continue
        if part.kind == MODULE:
            raise UserError(f"LoRA cannot go on {part.name} of model {model_cfg.name} (not a linear layer): fix "
                            "model.lora_targets")
        added += part.repeat * lora_cfg.r * part.features()
    if lora_cfg.get("train_head"):
        head = model_cfg.get("head") or "lm_head"
        heads = [p.name for p in shapes.parts if names_target(p.name, head)]
        added += sum(p.repeat * p.own for p in shapes.parts
                     if p.name in heads or any(p.name.startswith(h + ".") for h in heads))
    total = shapes.total() + added
    return {"trainable": added, "total": total, "percent": round(100.0 * added / total, 4)}


def count_parameters(model) -> dict:
    """Trainable and total parameters; `total` includes the adapters, as the paper's percentages do."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "total": total, "percent": round(100.0 * trainable / total, 4)}


def modules_with_adapters(model) -> set[str]:
    """Qualified names of the modules that received LoRA weights (for tests and reports)."""
    return {name for name, module in model.named_modules() if hasattr(module, "lora_A") and len(module.lora_A)}
