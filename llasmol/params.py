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

from omegaconf import DictConfig

from llasmol.frame import command, start
from llasmol.model.counting import base_of, base_weight_bytes, count_trainable
from llasmol.model.memory import describe


@command("params", sweeps=False)
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
        from llasmol.analysis.model_choices import print_bases  # lazy: the analysis package brings matplotlib (0.6 s)

        print_bases()
        raise SystemExit(0)
    main.from_command_line()
