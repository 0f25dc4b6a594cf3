"""Asking and reading a model as the paper did for the LLMs it did not tune on SMolInstruct (Section 5.2, App. A.2).

`evaluate`'s `prompting` setting (conf/prompting/) picks a style: `dataset` (SMolInstruct's own queries in the
model's prompt template, answers between the task's tags: what LlaSMol models were trained on), or one of
the base-model styles of `llasmol.data.untuned_queries` (`icl` k-shot, `galactica`, `molinst`) with an official
extraction rule set of `llasmol.metrics.answer_rules`. The in-context examples of sample `i` are drawn
from the training split's samples of the same task with `numpy.random.default_rng([seed, i])`: the same
examples whatever the order, batch or subset of the evaluated samples.

A record of such a run keeps the outputs as generated (not stripped) as `predictions`, the query as `query`,
the rule set's name as `extraction` and its answers as `answers`. The scorer scores those answers exactly as
the rule gave them (`llasmol.metrics.scoring.given_answers`), as the official pipeline scores the output of
`prediction_extraction.py`'s `extract_pred` (an answer holding the task's tags is scored whole, not re-read
between them), so re-scoring the predictions file gives the same numbers as the official scorer on the same
answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from llasmol.core.errors import UserError
from llasmol.core.schema import DATASET_STYLE
from llasmol.core.tasks import TASK_NAMES
from llasmol.data.untuned_queries import Example, galactica_query, icl_query, molinst_query
from llasmol.metrics.answer_rules import TEXT_WITH_PROMPT, check_rules, extract_base_answer


@dataclass(frozen=True)
class Protocol:
    style: str  # one of core.schema.UNTUNED_STYLES
    shots: int  # in-context examples per query (icl only)
    rules: str  # extraction rule set
    seed: int

    @property
    def setting(self) -> str:
        """How the rows are labelled: ``1-shot``, ``0-shot``."""
        return f"{self.shots}-shot"


def protocol_for(prompting, bare: bool) -> Optional[Protocol]:
    """The protocol `prompting` asks for, or None for SMolInstruct's own queries. A base's default protocol
    (`bare_only`) applies to the bare base (ckpt=none) only: a tuned checkpoint gets the queries it learnt."""
    style = str(prompting["style"])
    if style == DATASET_STYLE or (prompting["bare_only"] and not bare):
        return None
    return Protocol(style, prompting["shots"], check_rules(str(prompting["rules"])), prompting["seed"])


def draw_examples(train, index: int, task: str, shots: int, seed: int) -> list[Example]:
    """`shots` distinct training samples of `task` for evaluated sample `index`, drawn from `seed`."""
    start = 0
    for name, count in train.counts().items():
        if name == task:
            break
        start += count
    else:
        count = 0
    if count < shots:
        raise UserError(f"{shots}-shot prompts need {shots} training samples of {task}; the training split has "
                        f"{count}: lower prompting.shots or use data with {task} in its training split")
    picks = np.random.default_rng([seed, index]).choice(count, size=shots, replace=False)
    return [_example(train[start + int(j)]) for j in picks]


def _example(sample: dict) -> Example:
    target = sample.get("target")
    return Example(str(sample["raw_input"]), str(sample["raw_output"]), None if target is None else str(target))


def build_queries(protocol: Protocol, split, indices: list[int], train=None) -> dict[int, str]:
    """The query of every evaluated sample, by index (`train`: the training split, for icl examples)."""
    own = [t for t in split.tasks if t not in TASK_NAMES]
    if own:
        raise UserError(f"prompting.style={protocol.style} asks SMolInstruct's tasks as the paper asked untuned bases; "
                        f"{own[0]} is a task of your own, which it has no query for: use prompting=dataset, or "
                        "data.tasks=[...] without your tasks")
    queries = {}
    for i in indices:
        sample = split[i]
        task, question = sample["task"], _example(sample)
        if protocol.style == "icl":
            shots = draw_examples(train, i, task, protocol.shots, protocol.seed) if protocol.shots else []
            queries[i] = icl_query(task, question, shots)
        elif protocol.style == "galactica":
            queries[i] = galactica_query(task, question)
        else:
            queries[i] = molinst_query(task, question)
    return queries


def read_answers(protocol: Protocol, records: list[dict], queries: dict[int, str]) -> list[dict]:
    """`records` with the rule set's answers (`answers`) of their outputs as generated (`predictions`)."""
    for record in records:
        query, task = queries[record["index"]], record["task"]
        record["query"], record["extraction"] = query, protocol.rules
        responses = record["predictions"]
        if responses is None:  # skipped: the prompt was over the token limit
            continue
        record["answers"] = [extract_base_answer(protocol.rules, task, _read_text(protocol, query, r))
                             for r in responses]
    return records


def _read_text(protocol: Protocol, query: str, response: str) -> str:
    """What the rule set reads: the response, or (Galactica, Molinst) the query followed by it, as the official
    outputs held the prompt and the text generated after it, unstripped (Galactica's rules cut at newlines)."""
    return query + response if protocol.rules in TEXT_WITH_PROMPT else response
