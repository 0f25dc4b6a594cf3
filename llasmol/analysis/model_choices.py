"""The bases a run may start from, one row per `model=` choice: what `python -m llasmol.params --list` prints
and docs/recipe.md's table of bases is checked against (tests/test_docs.py)."""

from __future__ import annotations

from omegaconf import OmegaConf

from llasmol.analysis.paper import PAPER_MODEL_OF_BASE
from llasmol.core.config import CONFIG_DIR, compose_config
from llasmol.data.formatting import PROMPT_TEMPLATES
from llasmol.model.counting import base_of
from llasmol.model.shapes import Shapes


def bases_table() -> list[dict]:
    """One row per `model=` choice (conf/model/): its Hub id, size (the base counted from its shapes), the
    vocabulary of its config.json facts, its prompt format, and the paper's LlaSMol model on it, if any. What
    `params --list` prints; docs/recipe.md's table of bases is checked against it (tests/test_docs.py)."""
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
