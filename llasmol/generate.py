"""`python -m llasmol.generate "<query>" [ckpt=<run dir | adapter dir>]`: ask a trained model one question.

A question holding `=` is a question unless it starts with one of generate's settings (`task=...`); to pass
any text whatever, write `query='<question>'`, which is taken literally too. Prints the response(s), best
first, and the answer read from between the response's tags (`llasmol.inference.asking`). Runs on CPU as
well as GPU.
"""

from __future__ import annotations

import sys
from typing import Optional

from omegaconf import DictConfig

from llasmol.core.config import NO_QUERY, overrides_of, split_free_text
from llasmol.core.errors import UserError
from llasmol.frame import command, start


def generate(cfg: DictConfig, query: Optional[str] = None) -> list[str]:
    """Responses to `query` (taken literally), or to `cfg.query` when none is given."""
    return _answer(cfg, query)[0]


def _asking():
    # lazy: asking brings torch and the model (1.5 s), which the checks before Hydra do not need
    from llasmol.inference import asking

    return asking


def _answer(cfg: DictConfig, query: Optional[str]):
    tasks = start(cfg).tasks  # the beams fit: the schema's
    return _asking().ask(cfg, query if query is not None else cfg.query, tasks)


_QUERY: Optional[str] = None  # the question from the command line, literally


def _has_question(argv: list[str]) -> None:
    """A command line without a question is one line before Hydra starts (a `hydra.run.dir=` read as a setting
    would make its folder first), naming what was read as settings; Hydra's own options (--help, --cfg) go on."""
    if _QUERY or any(arg.startswith("-") for arg in argv):
        return
    read = overrides_of(argv)
    raise UserError(NO_QUERY + (f"; read as setting(s): {', '.join(read)}; to ask one of them, give query='<it>'"
                                if read else ""))


@command("generate", sweeps=False, first=_has_question)
def main(cfg: DictConfig) -> None:
    responses, model_cfg, tasks = _answer(cfg, _QUERY)
    demo = "random" if model_cfg.get("random_init") else "pretrained" if model_cfg.get("tokenizer") == "tiny" else None
    for line in _asking().answer_lines(responses, cfg.task, demo, tasks):
        print(line, flush=True)


if __name__ == "__main__":
    sys.argv, _QUERY = split_free_text(sys.argv, "query", "generate")
    main.from_command_line()
