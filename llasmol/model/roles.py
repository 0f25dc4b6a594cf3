"""Which module of a base plays each LoRA role (q, k, v, o, gate, up, down): the model config's
`lora_targets`, or, where it is null (`model=hf`, a base that is not listed), read from the module names of
the base built on the `meta` device from its config.json, when one known naming scheme fits them."""

from __future__ import annotations

import logging
import re
from typing import Optional

from llasmol.core.errors import UserError
from llasmol.core.schema import ROLES  # checked there: a config's role names are roles

log = logging.getLogger(__name__)

# The naming schemes of transformers' implementations, as roles -> module names (a name matches a module
# whose qualified name is it or ends in "." + it, as PEFT's target_modules do). None: the family has no such
# layer. A fused module serves several roles at once (GPT-2's c_attn computes q, k and v): its roles are
# trained together or not at all (`llasmol.model.lora.target_modules`).
SCHEMES: dict[str, tuple[Optional[str], ...]] = {
    "Llama, Mistral, Qwen, Gemma, OLMo, Cohere, StableLM": (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "OPT, Galactica": ("q_proj", "k_proj", "v_proj", "out_proj", None, "fc1", "fc2"),
    "GPT-J": ("q_proj", "k_proj", "v_proj", "out_proj", None, "fc_in", "fc_out"),
    "Phi": ("q_proj", "k_proj", "v_proj", "self_attn.dense", None, "fc1", "fc2"),
    "StarCoder2": ("q_proj", "k_proj", "v_proj", "o_proj", None, "mlp.c_fc", "mlp.c_proj"),
    "GPT-2, GPT-BigCode": ("attn.c_attn",) * 3 + ("attn.c_proj", None, "mlp.c_fc", "mlp.c_proj"),
    "BLOOM, Falcon": ("self_attention.query_key_value",) * 3 + (
        "self_attention.dense", None, "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
    "GPT-NeoX, Pythia": ("attention.query_key_value",) * 3 + (
        "attention.dense", None, "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
    "MPT": ("attn.Wqkv",) * 3 + ("attn.out_proj", None, "ffn.up_proj", "ffn.down_proj"),
}

_BLOCK_PREFIX = re.compile(r"^.*?\.\d+\.")  # "model.layers.0." : what a block's module names start with
_INFERRED: dict[str, dict[str, Optional[str]]] = {}  # model.arch -> its inferred map: one meta build a process


def linear_layer_names(model, head: str = "lm_head") -> list[str]:
    """The distinct names of `model`'s linear layers (GPT-2's Conv1D ones too) within a block
    (`self_attn.q_proj`), in order of appearance, the output head left out."""
    import torch  # here, not at the top: llasmol.model.lora imports this module without torch or transformers
    from transformers.pytorch_utils import Conv1D

    names: dict[str, None] = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and name != head and not name.endswith("." + head):
            names[_BLOCK_PREFIX.sub("", name)] = None
    return list(names)


def _matches(target: str, names: list[str]) -> bool:
    return any(n == target or n.endswith("." + target) for n in names)


def infer_role_map(names: list[str], model: str) -> dict[str, Optional[str]]:
    """The role map of the one scheme in `SCHEMES` whose every module name is among `names`; otherwise a
    `UserError` listing the names seen and how to give the map."""
    fits = [scheme for scheme, targets in SCHEMES.items() if all(t is None or _matches(t, names) for t in targets)]
    if len(fits) == 1:
        return dict(zip(ROLES, SCHEMES[fits[0]]))
    why = (f"its module names fit several naming schemes ({'; '.join(fits)})" if fits
           else "no known naming scheme fits its module names")
    example = ",".join(f"{role}:<name>" for role in ROLES)
    raise UserError(
        f"model.lora_targets is null and {why}: the linear layers of {model} are {', '.join(names) or 'none'}; "
        f"name the roles from these, model.lora_targets={{{example}}} (null for a role it lacks)"
    )


def role_map(model_cfg) -> dict[str, Optional[str]]:
    """Role -> module name for `model_cfg`: its `lora_targets`, or inferred from its base's module names."""
    given = model_cfg.get("lora_targets")
    if given is not None:
        return {role: given.get(role) for role in ROLES}
    arch = str(model_cfg.arch)
    if arch not in _INFERRED:
        from llasmol.model.base import build_meta_model  # torch at import: only a map to infer needs it

        names = linear_layer_names(build_meta_model(model_cfg), model_cfg.get("head") or "lm_head")
        _INFERRED[arch] = infer_role_map(names, str(model_cfg.get("name") or arch))
        log.info("LoRA roles of %s read from its module names: %s", model_cfg.get("name") or arch,
                 ", ".join(f"{r}={n}" for r, n in _INFERRED[arch].items()))
    return dict(_INFERRED[arch])
