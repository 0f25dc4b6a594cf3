"""`python -m llasmol.export ckpt=<run dir | adapter> output=<folder>`: a merged model for plain transformers.

    python -m llasmol.export ckpt=outputs/train/<run> output=exported/<name>
    python -m llasmol.export ckpt=<adapter folder> model=mistral output=<folder> push_to_hub=<owner/name>

The adapter is folded into its base (PEFT's `merge_and_unload`, in the base's dtype) and the folder is what
`AutoModelForCausalLM.from_pretrained` reads, with no PEFT: safetensors shards, `config.json`,
`generation_config.json` (the paper's default decoding: 4 beams, up to 1,024 new tokens, `early_stopping`
false; per-task beams are in the model card), the tokenizer with its chat template if it has one, and
`README.md`, a model card: base, LoRA variant, data, recipe, and the run's test metrics beside the paper's row
with their intervals, or how to get them. The folder is written beside its final name and renamed into place.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from llasmol.core import offline, run_dir
from llasmol.core.errors import UserError
from llasmol.core.files import write_text
from llasmol.frame import command, start

log = logging.getLogger(__name__)


def _check_output(output: Path) -> None:
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise UserError(f"output={output} is not a folder: name a new folder for the exported model")
    if output.is_dir() and any(output.iterdir()):
        raise UserError(f"output={output} holds files already: name a new (or empty) folder; nothing is replaced")


def _generation_config(cfg: DictConfig, tokenizer):
    from transformers import GenerationConfig

    default = cfg.generation.default
    return GenerationConfig(num_beams=int(default.num_beams), num_return_sequences=int(default.num_return_sequences),
                            max_new_tokens=int(default.max_new_tokens), early_stopping=bool(default.early_stopping),
                            do_sample=False, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                            else tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)


def _run_section(ckpt: Path) -> tuple[list[str], list[str]]:
    """(what the run was: lines, its evaluation: lines) for a run directory; empty for an adapter folder."""
    if not (ckpt / run_dir.HYDRA_CONFIG).is_file():
        return [], []
    from llasmol import analysis  # lazy: matplotlib (0.6 s), for the card only
    from llasmol.analysis.pairs import interval_table
    from llasmol.inference.loading import read_run_config

    run_cfg = read_run_config(ckpt / run_dir.HYDRA_CONFIG)
    data, lora, recipe = run_cfg.data, run_cfg.lora, run_cfg
    from llasmol.data.custom import is_table

    bundled = Path(__file__).parent / "data" / "bundled"

    def described(place) -> str:
        if Path(str(place)).resolve() == bundled.resolve():
            return "SMolInstruct, the excerpt bundled with llasmol (llasmol/data/bundled: a few hundred samples a task)"
        return f"{place}, a table of its own" if is_table(str(place)) else f"SMolInstruct, {place}"

    places = [described(data.path) if data.get("path") else
              f"SMolInstruct, {data.get('hub_id')} at revision {data.get('revision')}"]
    places += [described(place) for place in data.get("also") or []]
    own = data.get("new_tasks") or {}
    facts = [
        f"- LoRA variant: `{lora.name}` (r={lora.r}, alpha={lora.alpha}, dropout={lora.dropout}, roles "
        f"{', '.join(lora.targets)}{', and the output head' if lora.get('train_head') else ''})",
        f"- data: {'; '.join(places)}" + (f"; tasks {', '.join(data.tasks)}" if data.get("tasks") else "; every task"),
        *(["- tasks of its own (data.new_tasks, scored as their family): " + ", ".join(
            f"{name} ({decl.get('family')})" for name, decl in own.items())] if own else []),
        f"- recipe: {recipe.optimizer._target_.rsplit('.', 1)[-1]} at lr {recipe.optimizer.lr}, effective batch "
        f"{data.effective_batch_size}, " + (f"{recipe.trainer.max_steps} optimizer steps"
                                            if (recipe.trainer.get("max_steps") or -1) > 0
                                            else f"{recipe.trainer.get('max_epochs')} epoch(s)") + f", seed {recipe.seed}",
    ]
    run = analysis.load_run(ckpt)
    if "test" not in run.evaluations:
        return facts, [f"Not evaluated on the test split yet: `python -m llasmol.evaluate ckpt={ckpt} data.split=test`, "
                       "then export again."]
    table = analysis.evaluation_table(run, "test")
    intervals = interval_table(run.evaluation("test"))
    bounds = {(r["task"], r["metric"]): (r["lo"], r["hi"]) for r in intervals.records()}
    table.columns.insert(3, "95% interval")
    for row in table.rows:
        lo, hi = bounds.get((row[0], row[1]), (None, None))
        row.insert(3, "-" if lo is None else f"[{lo:.3f}, {hi:.3f}]")
    return facts, [analysis.evaluation_note(run, table) + table.to_markdown(),
                   f"Evaluated with `python -m llasmol.evaluate ckpt={ckpt} data.split=test`: the paper's beam search "
                   "per task, answers read between the task's tags and scored by the paper's metrics (App. A.4); "
                   "intervals are percentile bootstraps of the samples."]


def _validated_tasks(ckpt: Path) -> list[str]:
    """The tasks a run directory's newest validation scored (none for an adapter folder)."""
    from llasmol import analysis  # lazy: matplotlib (0.6 s), for the card only

    if not (ckpt / run_dir.HYDRA_CONFIG).is_file():
        return []
    latest = analysis.load_run(ckpt).latest
    return list(latest.metrics) if latest else []


def model_card(cfg: DictConfig, model_cfg: DictConfig, adapter: str) -> str:
    from llasmol.inference.beam_search import task_settings

    facts, evaluation = _run_section(Path(str(cfg.ckpt)))
    base = model_cfg.get("hf_id") or model_cfg.name
    tasks = run_dir.read_tasks(Path(str(cfg.ckpt)))  # the run's own tasks (none for an adapter folder)
    own = list(tasks.declared)
    smolinstruct = not own or any(tasks.task(t).in_smolinstruct for t in _validated_tasks(Path(str(cfg.ckpt))))
    beams = ", ".join(f"{task} {b.num_beams}/{b.num_return_sequences}" for task, b in cfg.generation.tasks.items())
    beams += "".join(f", {task} {s.num_beams}/{s.num_return_sequences} (its own)"
                     for task in own for s in [task_settings(cfg.generation, task, tasks)])
    trained_on = ("SMolInstruct and " if smolinstruct else "") + (f"tasks of its own ({', '.join(own)})" if own
                                                                   else "SMolInstruct")
    lines = [
        "---", "library_name: transformers", "tags: [chemistry, llasmol, smolinstruct, lora-merged]",
        *([f"base_model: {base}"] if model_cfg.get("hf_id") else []), "---", "",
        f"# {model_cfg.name} + LlaSMol adapter, merged", "",
        f"A causal LM fine-tuned with LoRA on {trained_on} (SMolInstruct: Yu et al. 2024, arXiv 2402.09391) by llasmol, the adapter "
        "merged into its base: it loads with `AutoModelForCausalLM.from_pretrained` and needs no PEFT.", "",
        f"- base: `{base}` ({model_cfg.dtype}{', random initial weights: a demo, not a chemistry model' if model_cfg.get('random_init') else ''})",
        f"- adapter: `{adapter}`", *facts,
        f"- prompt: `{OmegaConf.select(model_cfg, 'prompt_template')}`; answers between tags such as `<SMILES> … </SMILES>`",
        "", "## Decoding", "",
        f"`generation_config.json` holds the paper's default ({cfg.generation.default.num_beams} beams, up to "
        f"{cfg.generation.default.max_new_tokens} new tokens, `early_stopping` false). Beams / returned answers by "
        f"task, as the paper's evaluation: {beams}.", "",
        "## Evaluation", "", *evaluation, "",
    ]
    return "\n".join(lines)


def export(cfg: DictConfig) -> Path:
    """Merge `cfg.ckpt`'s adapter into its base and write the model folder `cfg.output`; returns it."""
    start(cfg)
    output = Path(str(cfg.output))
    _check_output(output)
    from llasmol.inference.loading import load_model, resolve_checkpoint  # lazy: torch and transformers

    model_cfg, adapter, _ = resolve_checkpoint(str(cfg.ckpt), cfg)  # an adapter: the schema refuses ckpt=none
    card = model_card(cfg, model_cfg, adapter)  # first: a run's unreadable files stop it before minutes of merging
    model, tokenizer = load_model(model_cfg, adapter, None, merge=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True, max_shard_size=str(cfg.max_shard_size))
        tokenizer.save_pretrained(staging)
        _generation_config(cfg, tokenizer).save_pretrained(staging)
        write_text(staging / "README.md", card)
        # mkdtemp's folder is private and some writers' files too: the folder is for colleagues, as umask allows
        umask = _umask()
        for path in [staging, *staging.rglob("*")]:
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
        if output.is_dir():
            output.rmdir()  # empty: checked above
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %s + %s into %s", model_cfg.name, adapter, output)
    if cfg.push_to_hub:
        push(output, str(cfg.push_to_hub))
    return output


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def push(folder: Path, repo_id: str) -> None:
    """Upload `folder` to the Hub repo `repo_id` (made if missing); offline, one line saying where the folder is."""
    reason = offline.hub_unreachable()
    if reason is not None:
        raise UserError(f"push_to_hub={repo_id}: the Hub is not reachable ({reason}); the exported folder is "
                        f"{folder}: upload it later with `hf upload {repo_id} {folder}`")
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id)
    log.info("uploaded %s to https://huggingface.co/%s", folder, repo_id)


@command("export")
def main(cfg: DictConfig) -> Optional[Path]:
    folder = export(cfg)
    print(f"exported to {folder}: AutoModelForCausalLM.from_pretrained({str(folder)!r}) loads it, no PEFT needed",
          flush=True)
    return folder


if __name__ == "__main__":
    main.from_command_line()
