"""`python -m llasmol.params model=<m> lora=<l>`: trainable-parameter count on the meta device.

Nothing is downloaded or allocated: the model is built from its bundled config.json facts. It also says
how much memory the base's weights take in `model.dtype`, or quantised (`quantization=4bit|8bit`). The last
line printed is a JSON object `{"trainable": int, "total": int, "base": int, "percent": float,
"weight_bytes": int}`: `total` counts the adapters too (the paper's percentages divide by it), `base` is the
base model alone (what a model card counts). `python -m llasmol.params --list` lists every `model=` choice.
"""

from __future__ import annotations

import json
import sys

from omegaconf import DictConfig, OmegaConf

from llasmol.core.config import CONFIG_DIR, compose_config
from llasmol.data.formatting import PROMPT_TEMPLATES
from llasmol.frame import command, start
from llasmol.model.counting import base_of, base_weight_bytes, count_trainable
from llasmol.model.memory import describe
from llasmol.model.shapes import Shapes


def bases_table() -> list[dict]:
    """One row per `model=` choice (conf/model/): its Hub id, size (the base counted from its shapes), the
    vocabulary of its config.json facts, its prompt format, and the paper's LlaSMol model on it, if any. What
    `params --list` prints; docs/recipe.md's table of bases is checked against it (tests/test_docs.py)."""
    from llasmol.analysis.paper import PAPER_MODEL_OF_BASE  # lazy: the analysis package brings matplotlib (0.6 s)

    # A LoRA variant that means one base (lora=large: LlaSMol Large on llama2_13b) names it in its file.
    variant_of = {}
    for file in sorted((CONFIG_DIR / "lora").glob("*.yaml")):
        base = OmegaConf.load(file).get("lora", {}).get("base")
        if base:
            variant_of[base] = file.stem
    rows = []
    for file in sorted((CONFIG_DIR / "model").glob("*.yaml"), key=lambda f: (f.stem != "tiny", f.stem)):
        name = file.stem
        if name == "hf":  # any base from a folder: nothing to count without one
            rows.append({"model": "hf", "hub_id": "model.name=<its id>", "size": None, "vocabulary": None,
                         "format": "paper", "paper": None})
            continue
        model = compose_config([f"model={name}"], "params").model
        base = base_of(OmegaConf.create({"model": model}))
        base = base if isinstance(base, Shapes) else Shapes.of(base)
        template = model.prompt_template
        paper = PAPER_MODEL_OF_BASE.get(name) or (f"LlaSMol {variant_of[name].capitalize()} (lora={variant_of[name]})"
                                                  if name in variant_of else None)
        rows.append({"model": name, "hub_id": model.hf_id, "size": base.total(), "vocabulary": base.vocab_size,
                     # the paper's [INST] template is `paper` in the docs' table, as here
                     "format": "paper" if template == PROMPT_TEMPLATES["llasmol"] else template,
                     "paper": paper})
    return rows


def print_bases() -> None:
    """`params --list`: every `model=` choice, one line each."""
    rows = bases_table()

    def size(n):
        return "-" if n is None else (f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M")

    cells = [["model=", "Hub id", "size", "vocabulary", "prompt", "the paper's model on it"]] + [
        [r["model"], r["hub_id"] or "- (bundled)", size(r["size"]), "-" if r["vocabulary"] is None else
         f"{r['vocabulary']:,}", r["format"], r["paper"] or "-"] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for row in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("\nprompt paper: [INST] {input} [/INST], as the paper formats every sample; chat_template: the "
          "tokenizer's own. Counts: "
          "python -m llasmol.params model=<name> lora=<variant>; every base in docs/recipe.md.")


@command("params")
def main(cfg: DictConfig) -> None:
    start(cfg, torch=False)
    base = base_of(cfg)  # found or built once
    sizes = base_weight_bytes(cfg, base)  # first: PEFT may adapt `base` in place while counting
    counts = count_trainable(cfg, base)
    print(
        f"{cfg.model.name} + LoRA {cfg.lora.name}: {counts['trainable'] / 1e6:.1f}M trainable "
        f"of {counts['total'] / 1e6:.1f}M ({counts['percent']:.2f}%); the base alone has {counts['base'] / 1e6:.1f}M"
    )
    print(describe(sizes, cfg.model.dtype, cfg.get("quantization")))
    print(json.dumps({**counts, "weight_bytes": sizes["total"]}))


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:  # before Hydra, which has no such flag
        print_bases()
        raise SystemExit(0)
    main.from_command_line()
