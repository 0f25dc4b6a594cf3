"""`python -m llasmol.params model=<m> lora=<l>`: trainable-parameter count on the meta device, and a GPU run planned
from it.

Nothing is downloaded or allocated: the model is built from its bundled config.json facts. It also says how much
memory the base's weights take in `model.dtype`, or quantised (`quantization=4bit|8bit`), the training peak per
device at the config's micro-batch and max length with gradient checkpointing off and on, and for SMolInstruct or
the bundled sample the tokens of an epoch and its time on H100, H200 and A100 GPUs (`llasmol.model.plan`). The last
line printed is a JSON object `{"trainable": int, "total": int, "base": int, "percent": float, "weight_bytes": int,
"train_peak_bytes": int, "train_peak_bytes_checkpointing": {"off": int, "on": int}, "tokens_per_epoch": int|null,
"epoch_seconds": {gpu: float}|null, "run_seconds": {gpu: float}|null}`: `total` counts the adapters too (the paper's
percentages divide by it), `base` is the base model alone (what a model card counts). `python -m llasmol.params
--list` lists every `model=` choice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import DictConfig

from llasmol.core.config import PACKAGE_DIR
from llasmol.core.tasks import TASK_NAMES, get_task
from llasmol.frame import command, start
from llasmol.model.counting import base_of, base_weight_bytes, count_trainable
from llasmol.model.memory import describe
from llasmol.model.plan import MEAN_TOKENS, memory_plan, time_plan
from llasmol.model.shapes import Shapes


def epoch_samples(data: DictConfig) -> dict[str, int] | None:
    """Training samples of each task in an epoch: the bundled sample's lists, SMolInstruct's Table 1 (v1.0.0's
    counts) for the archive, None for data of one's own."""
    from llasmol.data.smolinstruct import count_samples  # here: numpy and ijson, which counting weights spares

    path = data.get("path")
    if data.get("new_tasks") or data.get("also") or data.get("weights") or (path and not Path(path, "raw").is_dir()):
        return None  # data of one's own, beside or instead of SMolInstruct's
    if path is None or Path(path).resolve() != PACKAGE_DIR / "data" / "bundled":
        return {t: get_task(t).paper_counts[0] for t in (data.tasks or TASK_NAMES)}
    # the bundled sample's tasks: the 11 whose lengths MEAN_TOKENS measures on it
    return {t: count_samples(path, data.sample_group, data.splits.train, t) for t in data.tasks or MEAN_TOKENS}


@command("params", sweeps=False)
def main(cfg: DictConfig) -> None:
    start(cfg, torch=False)
    base = base_of(cfg)  # found or built once
    shapes = base if isinstance(base, Shapes) else Shapes.of(base)  # first: PEFT may adapt `base` in place counting
    sizes = base_weight_bytes(cfg, shapes)
    counts = count_trainable(cfg, base)
    print(
        f"{cfg.model.name} + LoRA {cfg.lora.name}: {counts['trainable'] / 1e6:.1f}M trainable "
        f"of {counts['total'] / 1e6:.1f}M ({counts['percent']:.2f}%); the base alone has {counts['base'] / 1e6:.1f}M"
    )
    print(describe(sizes, cfg.model.dtype, cfg.get("quantization")))
    memory_lines, memory, act = memory_plan(cfg, shapes, sizes, counts["trainable"])
    time_lines, times = time_plan(cfg, shapes, counts["trainable"], act, epoch_samples(cfg.data))
    print("\n".join(memory_lines + time_lines))
    print(json.dumps({**counts, "weight_bytes": sizes["total"], **memory, **times}))


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:  # before Hydra, which has no such flag
        from llasmol.analysis.model_choices import print_bases  # lazy: the analysis package brings matplotlib (0.6 s)

        print_bases()
        raise SystemExit(0)
    main.from_command_line()
