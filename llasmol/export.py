"""`python -m llasmol.export ckpt=<run dir | adapter> output=<folder> [push_to_hub=<owner/name>]`: a merged model.

The adapter is folded into its base (PEFT's `merge_and_unload`, in the base's dtype) and the folder is what
`AutoModelForCausalLM.from_pretrained` reads, with no PEFT: safetensors shards, `config.json`,
`generation_config.json` (one question, greedy, as the official generation decodes it), the tokenizer, and
`README.md`, a model card: base, LoRA variant, data, recipe (the facts its run saved at train time), per-task
beams, and the run's test metrics beside the paper's row with their intervals, or how to get them. An adapter
folder names its base (`model=mistral`). Written beside its final name (`model.adapters.export_staging`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from llasmol.core import offline, run_dir
from llasmol.core.files import check_new_folder
from llasmol.frame import command, start
from llasmol.model.adapters import export_staging, save_merged
from llasmol.model.cards import merged_card

log = logging.getLogger(__name__)


def model_card(cfg: DictConfig, model_cfg: DictConfig, adapter: str) -> str:
    """The exported model's README.md: the facts its run saved at train time, its beams, its test metrics."""
    from llasmol.analysis.pairs import card_evaluation  # lazy: matplotlib (0.6 s), for the card only
    from llasmol.inference.beam_search import task_settings  # lazy: torch

    ckpt = Path(str(cfg.ckpt))
    is_run = (ckpt / run_dir.HYDRA_CONFIG).is_file()
    tasks = run_dir.read_tasks(ckpt)  # the run's own tasks (none for an adapter folder)
    facts = run_dir.read_card(ckpt)
    trained = set((facts or {}).get("tasks") or cfg.generation.tasks)  # the run's tasks; unknown: every one
    beams = [f"{task} {b.num_beams}/{b.num_return_sequences}" for task, b in cfg.generation.tasks.items()
             if task in trained]
    beams += [f"{task} {s.num_beams}/{s.num_return_sequences} (its own)"
              for task in tasks.declared for s in [task_settings(cfg.generation, task, tasks)]]
    q = cfg.generation.question
    decoding = (f"`generation_config.json` decodes one question as the official `LlaSMolGeneration.generate` does "
                f"({q.num_beams} beam(s), up to {q.max_new_tokens} new tokens). Beams / returned answers "
                f"by task, as the paper's evaluation: {', '.join(beams)}.")
    named = Path(adapter).relative_to(ckpt) if is_run and Path(adapter).is_relative_to(ckpt) else Path(adapter).name
    evaluation = card_evaluation(ckpt, str(cfg.ckpt)) if is_run else []
    return merged_card(model_cfg, facts, str(named), decoding, evaluation)


def export(cfg: DictConfig) -> Path:
    """Merge `cfg.ckpt`'s adapter into its base and write the model folder `cfg.output`; returns it."""
    start(cfg)
    output = Path(str(cfg.output))
    check_new_folder(output, "output", "for the exported model")
    from llasmol.inference.beam_search import generation_config  # lazy: torch and transformers
    from llasmol.inference.loading import load_model, resolve_checkpoint

    model_cfg, adapter, _ = resolve_checkpoint(str(cfg.ckpt), cfg)  # an adapter: the schema refuses ckpt=none
    card = model_card(cfg, model_cfg, adapter)  # first: a run's unreadable files stop it before minutes of merging
    with export_staging(output) as staging:  # before the merge too: another export into output is one line
        model, tokenizer = load_model(model_cfg, adapter, None, merge=True)
        save_merged(model, tokenizer, generation_config(cfg.generation, tokenizer), card, staging, output,
                    str(cfg.max_shard_size))
    log.info("exported %s + %s into %s", model_cfg.name, adapter, output)
    if cfg.push_to_hub:
        offline.push_folder(output, str(cfg.push_to_hub))
        log.info("uploaded %s to https://huggingface.co/%s", output, cfg.push_to_hub)
    return output


@command("export", sweeps=False)
def main(cfg: DictConfig) -> Path:
    folder = export(cfg)
    print(f"exported to {folder}: AutoModelForCausalLM.from_pretrained({str(folder)!r}) loads it, no PEFT needed",
          flush=True)
    return folder


if __name__ == "__main__":
    main.from_command_line()
