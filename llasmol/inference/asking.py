"""One question to a model, as `evaluate` asks a sample: `python -m llasmol.generate`'s library half.

The SMILES inside the first <SMILES> … </SMILES> is first written as SMolInstruct writes it (canonical Kekulé
SMILES, the form a LlaSMol model was trained on), as the official generation does (`canonicalize_query`); the
answer is read from the best response as the scorer reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from llasmol.core.config import NO_QUERY
from llasmol.core.errors import UserError
from llasmol.core.run_dir import read_tasks
from llasmol.core.smiles import MAX_SMILES_CHARS, canonicalize_query, tagged_smiles
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.data.formatting import PromptFormatter
from llasmol.inference.beam_search import BeamGenerator
from llasmol.inference.loading import load_model, pick_device, resolve_checkpoint
from llasmol.inference.pipeline import ModelAnswers
from llasmol.metrics.extract import any_answer, extract_answer


def answer_of(response: str, task: Optional[str] = None, tasks: TaskTable = SMOLINSTRUCT) -> Optional[str]:
    """The answer the scorer would extract for `task` (a task of `tasks`); without a task, the text between the
    first complete pair of answer tags in `response`."""
    return extract_answer(task, response, tasks) if task else any_answer(response, tasks)


def ask(cfg: DictConfig, query: Optional[str], tasks: TaskTable) -> tuple[list[str], DictConfig, TaskTable]:
    """The responses to `query` (taken literally) of the model `cfg` names (generate's config), best first; the
    config of the model that gave them; and the task table `cfg.task` was read by (`tasks` and, for a run
    folder, the run's declared tasks)."""
    if cfg.ckpt and Path(str(cfg.ckpt)).is_dir():
        tasks = read_tasks(Path(str(cfg.ckpt)), tasks)  # a run's own task may be asked for by name
    if cfg.task is not None:
        tasks.task(cfg.task, "task= (or leave task out for one greedy answer)")
    if not query:
        raise UserError(NO_QUERY)
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f"the query holds bytes that are not UTF-8 text (at character {err.start}, "
                        f"{query[err.start:err.end]!r}): pass it as UTF-8") from None
    molecule = tagged_smiles(query)
    if molecule is not None and len(molecule) > MAX_SMILES_CHARS:  # RDKit would stall or crash on it
        raise UserError(f"the query's SMILES is {len(molecule):,} characters, past the {MAX_SMILES_CHARS:,} any "
                        "molecule is read with here: ask about a smaller molecule")
    device = pick_device(cfg.device)  # before the base loads: a device this machine lacks is one line at once
    model_cfg, adapter, _ = resolve_checkpoint(cfg.ckpt, cfg)
    model, tokenizer = load_model(model_cfg, adapter, cfg.get("quantization"), merge=cfg.merge_adapter)
    # The tokenizer reads a special token's text as the token itself: an end of sequence or a turn marker in
    # the question would end or restart the prompt the model was trained on.
    special = [t for t in getattr(tokenizer, "all_special_tokens", []) if t and t in query]
    if special:
        raise UserError(f"the query holds {special[0]!r}, a special token of {model_cfg.name}'s tokenizer, which would "
                        "end or restart the prompt: leave it out of the question")
    model.to(device)
    formatter = PromptFormatter(tokenizer, model_cfg.prompt_template)
    generator = BeamGenerator(model, tokenizer, formatter, cfg.generation.max_prompt_tokens, 1)
    # the answering of evaluate, for one question; no task: the default beam settings
    asked = canonicalize_query(query)
    responses = ModelAnswers(generator, cfg.generation, tasks=tasks).ask(asked, cfg.task or "")
    if responses is None:
        length = len(formatter.prompt_ids(asked))
        raise UserError(f"the query's prompt is {length} tokens, longer than generation.max_prompt_tokens="
                        f"{cfg.generation.max_prompt_tokens}: shorten the question or raise the setting")
    return responses, model_cfg, tasks


def answer_lines(responses: list[str], task: Optional[str], demo: Optional[str],
                 tasks: TaskTable = SMOLINSTRUCT) -> list[str]:
    """What `generate` prints: each response as generated, the answer read from the first as the scorer reads
    it, and what the answers stand on when the base is the demo's (`demo`: "random" for its random weights,
    "pretrained" for the demo base, None for any other base)."""
    lines = [f"[{rank}] as generated: {response}" for rank, response in enumerate(responses, 1)]
    answer = answer_of(responses[0], task, tasks) if responses else None
    how = f"as the scorer reads {task}" if task else "the first tagged answer"
    lines.append(f"answer ({how}): {answer if answer is not None else 'none found in [1]'}")
    if not task:
        lines.append("(no task=: one greedy answer, as the official generation decodes a question; task=<name> gives "
                     "that task's beams, top-k answers and the scorer's answer extraction)")
    if demo == "pretrained":
        lines.append("note: model=tiny is the demo base (0.8M parameters, pretrained on RDKit facts), not a chemistry "
                     "model for real use: it writes formulas well and little else; LlaSMol's own: model=mistral "
                     "ckpt=osunlp/LlaSMol-Mistral-7B")
    elif demo:
        lines.append("note: model=tiny is the demo's small random-weight base, not a chemistry model: its answers "
                     "show the pipeline works; LlaSMol's own: model=mistral ckpt=osunlp/LlaSMol-Mistral-7B")
    return lines
