"""`python -m llasmol.generate "<query>" [ckpt=<run dir | adapter dir>]`: ask a trained model one question.

A question holding `=` is a question unless it starts with one of generate's settings (`task=...`); to pass
any text whatever, write `query='<question>'`, which is taken literally too.

The SMILES inside the first <SMILES> … </SMILES> is first written as SMolInstruct writes it (canonical Kekulé
SMILES, the form a LlaSMol model was trained on), as the official generation does (`canonicalize_query`).
Prints the response(s), best first, and the answer extracted from between the response's tags. Runs on
CPU as well as GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from llasmol.core.config import CONFIG_DIR, VALUED_OPTIONS, compose_config
from llasmol.core.errors import UserError
from llasmol.core.run_dir import read_tasks
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.data.formatting import PromptFormatter
from llasmol.core.smiles import canonicalize_query
from llasmol.frame import command, start
from llasmol.inference.loading import load_model, pick_device, resolve_checkpoint
from llasmol.metrics.extract import any_answer, extract_answer

OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*=")


def answer_of(response: str, task: Optional[str] = None, tasks: TaskTable = SMOLINSTRUCT) -> Optional[str]:
    """The answer the scorer would extract for `task` (a task of `tasks`); without a task, the text between the
    first complete pair of answer tags in `response`."""
    return extract_answer(task, response, tasks) if task else any_answer(response, tasks)


def generate(cfg: DictConfig, query: Optional[str] = None) -> list[str]:
    """Responses to `query` (taken literally), or to `cfg.query` when none is given."""
    return answer_query(cfg, query)[0]


def answer_query(cfg: DictConfig, query: Optional[str] = None) -> tuple[list[str], DictConfig, TaskTable]:
    """`generate`'s responses, the config of the model that gave them (what the command says it was) and the
    task table `task=` was read by."""
    tasks = start(cfg).tasks  # the beams fit: the schema's
    if cfg.ckpt and Path(str(cfg.ckpt)).is_dir():
        tasks = read_tasks(Path(str(cfg.ckpt)), tasks)  # a run's own task may be asked for by name
    if cfg.task is not None:
        tasks.task(cfg.task, "task= (or leave task out for the default beams)")
    # lazy: beam search and the pipeline bring torch (1.5 s), which the checks before Hydra do not need
    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.inference.pipeline import ModelAnswers

    query = query if query is not None else cfg.query
    if not query:
        raise UserError('no query: run python -m llasmol.generate "<your question>" [ckpt=<run dir>]')
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f"the query holds bytes that are not UTF-8 text (at character {err.start}, "
                        f"{query[err.start:err.end]!r}): pass it as UTF-8") from None
    model_cfg, adapter, _ = resolve_checkpoint(cfg.ckpt, cfg)
    model, tokenizer = load_model(model_cfg, adapter, cfg.get("quantization"), merge=cfg.merge_adapter)
    # The tokenizer reads a special token's text as the token itself: an end of sequence or a turn marker in
    # the question would end or restart the prompt the model was trained on.
    special = [t for t in getattr(tokenizer, "all_special_tokens", []) if t and t in query]
    if special:
        raise UserError(f"the query holds {special[0]!r}, a special token of {model_cfg.name}'s tokenizer, which would "
                        "end or restart the prompt: leave it out of the question")
    model.to(pick_device(cfg.device))
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


def _settings() -> frozenset[str]:
    """The names an override of generate may start with: its config's top-level keys and the config groups."""
    try:
        keys = set(compose_config([], "generate"))
    finally:
        GlobalHydra.instance().clear()
    groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()}
    return frozenset(keys | groups | {"hydra"})


def _split_query(argv: list[str], settings: Optional[frozenset[str]] = None) -> tuple[list[str], Optional[str]]:
    """Hydra takes only key=value overrides: the question is taken out of the arguments so that it is never
    parsed as config (`${oc.env:HOME}` in a question stays as written). It is `query=<question>` when given
    (taken literally, whatever it holds), else the first argument that is not an option or an override of one
    of generate's settings: `'a=b, c'` is a question, since `a` is no setting."""
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith("query="):
            return argv[:i] + argv[i + 1 :], arg[len("query="):]
    settings = _settings() if settings is None else settings
    for i, arg in enumerate(argv[1:], 1):
        if argv[i - 1] in VALUED_OPTIONS or arg.startswith("-"):
            continue
        key = re.split(r"[.=/@]", arg.lstrip("+~"), maxsplit=1)[0]
        if not (OVERRIDE.match(arg) and (key in settings or arg[0] in "+~")):  # +key=: a key added on purpose
            return argv[:i] + argv[i + 1 :], arg
    return argv, None


_QUERY: Optional[str] = None  # the question from the command line, literally


@command("generate")
def main(cfg: DictConfig) -> None:
    responses, model_cfg, tasks = answer_query(cfg, _QUERY)
    for line in answer_lines(responses, cfg.task, bool(model_cfg.get("random_init")), tasks):
        print(line, flush=True)


def answer_lines(responses: list[str], task: Optional[str], demo: bool, tasks: TaskTable = SMOLINSTRUCT) -> list[str]:
    """What `generate` prints: each response as generated, the answer read from the first as the scorer reads
    it, and what the numbers stand on when they cannot be chemistry (the demo's random-weight base)."""
    lines = [f"[{rank}] as generated: {response}" for rank, response in enumerate(responses, 1)]
    answer = answer_of(responses[0], task, tasks) if responses else None
    how = f"as the scorer reads {task}" if task else "the first tagged answer"
    lines.append(f"answer ({how}): {answer if answer is not None else 'none found in [1]'}")
    if not task:
        lines.append("(no task=: the default beams (4, one answer); task=<name> gives that task's beams, top-k "
                     "answers and the scorer's answer extraction)")
    if demo:
        lines.append("note: model=tiny is the demo's small random-weight base, not a chemistry model: its answers "
                     "show the pipeline works; LlaSMol's own: model=mistral ckpt=osunlp/LlaSMol-Mistral-7B")
    return lines


if __name__ == "__main__":
    sys.argv, _QUERY = _split_query(sys.argv)
    main.from_command_line()
