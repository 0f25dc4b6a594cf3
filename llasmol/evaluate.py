"""`python -m llasmol.evaluate`: the paper's metrics for a predictions file or a trained model.

    python -m llasmol.evaluate predictions=<file.jsonl>                     # no model needed
    python -m llasmol.evaluate ckpt=<run dir | adapter dir> data.split=test  # generate, then score
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from llasmol.core.config import CONFIG_DIR
from llasmol.core.errors import UserError, report_user_errors

REQUIRED = ("task", "input", "gold", "predictions")


def _texts(value, what: str, where: str, allow_none: bool = False) -> list[str]:
    """A gold or predictions field as a list of strings; numbers become their JSON text."""
    if value is None and allow_none:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise UserError(f"{where}: {what} must be a string or a list of strings, not {json.dumps(item)[:60]}")
        out.append(item if isinstance(item, str) else json.dumps(item))
    return out


def read_predictions(path: str | Path) -> list[dict]:
    """Records of a predictions JSONL file, checked line by line."""
    from llasmol.core.tasks import get_task

    path = Path(path)
    if not path.is_file():
        raise UserError(f"predictions file {path} does not exist: pass predictions=<file.jsonl>")
    records = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{path} line {lineno} is not valid JSON ({err.msg})") from None
            missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
            if missing:
                raise UserError(
                    f"{path} line {lineno} lacks {', '.join(missing)}: each line needs " + ", ".join(REQUIRED)
                )
            where = f"{path} line {lineno}"
            get_task(record["task"], where)
            record["skipped"] = bool(record.get("skipped")) or record["predictions"] is None
            record["gold"] = _texts(record["gold"], "gold", where)
            record["predictions"] = _texts(record["predictions"], "predictions", where, allow_none=True)
            records.append(record)
    if not records:
        raise UserError(f"predictions file {path} is empty: it needs one JSON object per line")
    return records


def _cell(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4f}"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """A per-task text table: one row per task, its metrics as `name=value`."""
    width = max((len(t) for t in results), default=4)
    return "\n".join(
        f"{task:<{width}}  " + "  ".join(f"{k}={_cell(v)}" for k, v in metrics.items())
        for task, metrics in results.items()
    )


def score_file(cfg: DictConfig) -> tuple[dict, Path]:
    from llasmol.core.files import write_json
    from llasmol.metrics.scoring import score_records

    records = read_predictions(cfg.predictions)
    results = score_records(records)
    src = Path(cfg.predictions)
    out = Path(cfg.output) if cfg.output else src.with_name(src.stem + ".metrics.json")
    write_json(out, results)
    return results, out


def generate_and_score(cfg: DictConfig) -> tuple[dict, Path]:
    import torch

    from llasmol.inference.records import balanced_subset, generate_records, score, split_golds
    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.core.files import write_json, write_jsonl
    from llasmol.inference.checkpoints import load_model, resolve_checkpoint
    from llasmol.inference.progress import generation_progress

    model_cfg, adapter, run_data = resolve_checkpoint(cfg.ckpt, cfg)
    # A run directory brings the data it was trained on; this command's split and sample cap apply.
    data_cfg = OmegaConf.to_container(run_data if run_data is not None else cfg.data, resolve=True)
    split_name = cfg.data.split
    data_cfg.pop("split", None)
    cap = cfg.data.get("max_samples_per_task")
    if run_data is None or cap is not None:
        data_cfg["max_samples_per_task"] = OmegaConf.to_container(cap) if isinstance(cap, DictConfig) else cap
    data_cfg.update(prompt_template=model_cfg.prompt_template, seed=cfg.seed)
    model, tokenizer = load_model(model_cfg, adapter, cfg.get("quantization"))
    device = "cuda" if cfg.device == "auto" and torch.cuda.is_available() else ("cpu" if cfg.device == "auto" else cfg.device)
    model.to(device)
    dm = hydra.utils.instantiate(data_cfg, tokenizer=tokenizer, _convert_="all")
    split = dm.split(split_name).split
    generator = BeamGenerator(model, tokenizer, dm.formatter, cfg.generation.max_prompt_tokens, cfg.generation.batch_size)
    indices = balanced_subset(split, None, cfg.seed)
    with generation_progress(f"Generating on {split_name}", len(indices)) as advance:
        golds = split_golds(dm.pooling_split(split_name))
        records = generate_records(generator, split, indices, golds, cfg.generation, advance)
    results = score(records, list(split.tasks), torch.device(device))
    out_dir = Path(cfg.paths.output_dir)
    write_jsonl(out_dir / "predictions" / f"{split_name}.jsonl", records)
    out = Path(cfg.output) if cfg.output else out_dir / "metrics" / f"{split_name}.json"
    write_json(out, results)
    return results, out


def evaluate(cfg: DictConfig) -> dict:
    """Score `cfg.predictions`, or generate with `cfg.ckpt` on `cfg.data.split` and score that."""
    if cfg.predictions:
        results, out = score_file(cfg)
    elif cfg.ckpt:
        results, out = generate_and_score(cfg)
    else:
        raise UserError("nothing to evaluate: pass predictions=<file.jsonl> or ckpt=<run dir | adapter dir>")
    return {"metrics": results, "output": str(out)}


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
@report_user_errors
def main(cfg: DictConfig) -> None:
    result = evaluate(cfg)
    print(format_table(result["metrics"]))
    print(f"metrics written to {result['output']}", flush=True)


if __name__ == "__main__":
    main()
