"""Which module of a base plays each LoRA role (q, k, v, o, gate, up, down): the model config's
`lora_targets` (a listed base takes its family's map from conf/model_family/roles/), or, where it is null
(`model=hf`, a base that is not listed), read from the module names of the base built on the `meta` device
from its config.json, when one of those naming schemes fits them."""

from __future__ import annotations

import logging
import re
from typing import Optional

from llasmol.core.errors import UserError
from llasmol.core.schema import ROLES  # checked there: a config's role names are roles
from llasmol.model.shapes import MODULE, Shapes

log = logging.getLogger(__name__)

# The naming schemes of transformers' implementations are the role maps in conf/model_family/roles/ (the
# listed bases take theirs from there too): roles -> module names, where a name matches a module whose
# qualified name is it or ends in "." + it, as PEFT's target_modules do, and null means the family has no such
# layer. A fused module serves several roles at once (GPT-2's c_attn computes q, k and v): its roles are
# trained together or not at all (`llasmol.model.lora.target_modules`).
def naming_schemes() -> dict[str, dict[str, Optional[str]]]:
    """Scheme name (its file's stem) -> role map, in name order; each file's first line names its families."""
    import yaml

    from llasmol.core.config import CONFIG_DIR  # hydra at import: only a map to infer needs it

    return {path.stem: yaml.safe_load(path.read_text(encoding="utf-8"))
            for path in sorted((CONFIG_DIR / "model_family" / "roles").glob("*.yaml"))}


_BLOCK_PREFIX = re.compile(r"^.*?\.(?:\d+|\*)\.")  # "model.layers.0." (or "model.layers.*." in a base's shapes)
_INFERRED: dict[str, dict[str, Optional[str]]] = {}  # model.arch -> its inferred map: one meta build a process


def linear_layer_names(model, head: str = "lm_head") -> list[str]:
    """The distinct names of `model`'s linear layers (GPT-2's Conv1D ones too) within a block
    (`self_attn.q_proj`), in order of appearance, the output head left out (`model`: or its `Shapes`)."""
    shapes = model if isinstance(model, Shapes) else Shapes.of(model)
    names: dict[str, None] = {}
    for part in shapes.parts:
        if part.kind != MODULE and not names_target(part.name, head):
            names[_BLOCK_PREFIX.sub("", part.name)] = None
    return list(names)


def names_target(name: str, target: str) -> bool:
    """Whether module `name` is what `target` names: PEFT's rule for target_modules (the name, or a qualified
    name ending in "." + it)."""
    return name == target or name.endswith("." + target)


def _matches(target: str, names: list[str]) -> bool:
    return any(names_target(n, target) for n in names)


def infer_role_map(names: list[str], model: str) -> dict[str, Optional[str]]:
    """The role map of the one naming scheme whose every module name is among `names`; otherwise a
    `UserError` listing the names seen and how to give the map."""
    schemes = naming_schemes()
    fits = [name for name, scheme in schemes.items()
            if all(scheme[role] is None or _matches(scheme[role], names) for role in ROLES)]
    if len(fits) == 1:
        return {role: schemes[fits[0]][role] for role in ROLES}
    why = (f"its module names fit several naming schemes ({', '.join(fits)} in conf/model_family/roles)" if fits
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
