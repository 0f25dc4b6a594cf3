"""Verifiable rewards for the RL stage, read from the scorer's own per-sample statistics, gated so that only an
answer can earn them: never a second copy of the scorer.

A completion earns anything at all only when it is *well formed*: it ended (its end of sequence came within its
token bound) and holds the task's answer tags exactly once, around a non-empty answer (a caption: any non-empty
text). Measured on the README's GRPO command (300 steps on the random-weight demo), a policy paid for form
learnt to scatter tags through text that never ends (93% of completions cut at their bound) and to answer water:
the gate takes that away. Then each term is one of the scorer's statistics of the completion read as one
prediction of its sample (`scoring.sample_stats`, with the run's task table and scoring settings), and an answer
that must be one token (a SMILES, a formula, a number, yes/no) counts only when it is the whole tagged text:
RDKit reads `CCO and more` as ethanol named "and more", so text after a SMILES would otherwise be free:

- format: the completion is well formed;
- validity: a molecule RDKit reads, or a formula that parses, **times its size agreement with the closest gold**
  (the smaller heavy-atom count over the larger), so `O` against a 25-atom product earns 1/25 of it; a finite
  number; yes or no;
- similarity: Morgan Tanimoto of the molecule to its closest gold (the paper's FTS); for names, the Dice
  overlap of their character trigrams with the closest gold's (partial credit for a near miss, little for a
  short trivial name);
- exact: the same molecule, formula or name as a gold (`hit_top1`, the paper's exact match);
- label: the gold's yes/no (what accuracy counts); error: 1 / (1 + |answer - gold|); meteor: the caption's METEOR.

Why this rather than validity gated by similarity, or no partial credit at all: ether0 (Narayanan et al. 2025, arXiv
2506.17238) rewards an answer a verifier accepts, in a strict answer format, and its authors recount how each
looser reward function was exploited in turn (A. White, "reward hacking in ether0", 2025). Here similarity and
exact match carry most of the weight (0.3 and 1.0 of 1.6 for SMILES, conf/reward/default.yaml), and the small
validity term is scaled by size, so no trivial answer is worth learning, while a plausible molecule of the right
size still earns more than a trivial one: a policy that starts far from right answers (the tiny demo) needs that
gradient, which an exact-match-only reward would not give it. tests/test_rewards.py holds every exploit the
demo found below a plausible wrong answer, family by family.

Your own terms: `reward.custom.<name>` names a function `fn(completion: str, gold: str, task: str) -> float`
(`_target_`, e.g. `mypackage.rewards.short_answers`) and its `weight`; it sees every well-formed completion (the
whole generated text and the sample's own gold) and its value is added, weighted, beside the built-in terms.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from typing import Any, Callable, Mapping, Optional

from omegaconf import OmegaConf

from llasmol.core.errors import UserError
from llasmol.core.schema import check_config
from llasmol.core.tasks import TaskTable
from llasmol.metrics.extract import _after_reasoning, untagged_answer
from llasmol.metrics.formula import parse_formula
from llasmol.metrics.molecules import heavy_atom_count
from llasmol.metrics.scoring import family, sample_stats

MAX_NAME_CHARS = 1_000  # a name past this is no name: its trigram overlap is not computed (0)


class Answer:
    """One well-formed completion as the terms read it: its tagged answer, whether it is one token, the scorer's
    statistics and judgement, and the golds."""

    def __init__(self, answer: str, stats: dict, judged: tuple, golds: list[str]) -> None:
        self.text, self.stats, self.judged, self.golds = answer, stats, judged, golds
        self.whole = not any(ch.isspace() for ch in answer)


def _size_agreement(size: Optional[int], gold_sizes: list[Optional[int]]) -> float:
    """The smaller heavy-atom count over the larger, against the closest gold (0 without a size on both sides)."""
    sizes = [g for g in gold_sizes if g]
    if not size or not sizes:
        return 0.0
    return max(min(size, g) / max(size, g) for g in sizes)


@functools.lru_cache(maxsize=65536)
def formula_heavy_atoms(text: str) -> Optional[int]:
    """Atoms other than hydrogen in a formula (any spelling `parse_formula` reads); None when it does not parse."""
    parsed = parse_formula(text)
    if parsed is None:
        return None
    atoms, _ = parsed  # ((symbol, isotope), count) pairs
    return sum(count for (symbol, _), count in atoms if symbol not in ("H", "D", "T")) or None


def _trigrams(text: str) -> Counter:
    padded = f"  {text.strip().lower()} "
    return Counter(padded[i:i + 3] for i in range(len(padded) - 2))


def name_overlap(answer: str, golds: list[str]) -> float:
    """The Dice overlap of `answer`'s character trigrams with the closest gold's (1 for the same text)."""
    if len(answer) > MAX_NAME_CHARS:
        return 0.0
    mine, best = _trigrams(answer), 0.0
    for gold in golds:
        if len(gold) > MAX_NAME_CHARS:
            continue
        theirs = _trigrams(gold)
        best = max(best, 2 * sum((mine & theirs).values()) / max(1, sum(mine.values()) + sum(theirs.values())))
    return best


_Term = Callable[[Answer], float]


def _molecule_validity(a: Answer) -> float:
    if not (a.whole and a.stats["num_valid"]):
        return 0.0
    return _size_agreement(heavy_atom_count(a.text), [heavy_atom_count(g) for g in a.golds])


def _formula_validity(a: Answer) -> float:
    if not a.whole or a.stats["num_invalid"]:
        return 0.0
    return _size_agreement(formula_heavy_atoms(a.text), [formula_heavy_atoms(g) for g in a.golds])


TERMS: dict[str, dict[str, _Term]] = {
    "smiles": {"format": lambda a: 1.0, "validity": _molecule_validity,
               "similarity": lambda a: a.stats["fts_morgan_sum"] if a.whole else 0.0,
               "exact": lambda a: a.stats["hit_top1"] if a.whole else 0.0},
    "formula": {"format": lambda a: 1.0, "validity": _formula_validity,
                "exact": lambda a: a.stats["hit_top1"] if a.whole else 0.0},
    "iupac": {"format": lambda a: 1.0, "similarity": lambda a: name_overlap(a.text, a.golds),
              "exact": lambda a: a.stats["hit_top1"]},
    "number": {"format": lambda a: 1.0, "validity": lambda a: a.stats["num_valid"] if a.whole else 0.0,
               "error": lambda a: 1.0 / (1.0 + a.judged[1]) if a.whole and a.stats["num_valid"]
               and a.judged[1] is not None else 0.0},
    "boolean": {"format": lambda a: 1.0, "validity": lambda a: float(a.whole and not a.stats["num_invalid"]),
                "label": lambda a: a.stats["tp"] + a.stats["tn"] if a.whole else 0.0},
    "caption": {"format": lambda a: 1.0, "meteor": lambda a: a.stats["meteor_sum"]},
}


def well_formed(completion: str, tag: Optional[str], ended: bool = True) -> Optional[str]:
    """The answer of a completion that ended with the task's tags exactly once around a non-empty answer (`tag`
    None: an untagged caption, the whole text); None for anything else."""
    if not ended or not isinstance(completion, str):
        return None
    text = _after_reasoning(completion)
    if tag is None:
        return untagged_answer(text)
    opening, closing = f"<{tag}>", f"</{tag}>"
    if text.count(opening) != 1 or text.count(closing) != 1:
        return None
    start, end = text.find(opening) + len(opening), text.find(closing)
    answer = text[start:end].strip() if start <= end else ""
    return answer or None


def overlong_penalty(length: int, limit: int, cache: int) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13; TRL's `get_soft_overlong_punishment`): 0 up to
    `limit - cache` tokens, then falling linearly to -1 at `limit`, -1 past it; 0 when `cache` is 0."""
    if cache <= 0 or length <= limit - cache:
        return 0.0
    if length <= limit:
        return (limit - cache - length) / cache
    return -1.0


class CustomTerm:
    """A user's reward function (`reward.custom.<name>`): `fn(completion, gold, task) -> float`, and its weight."""

    def __init__(self, name: str, spec: Mapping[str, Any]) -> None:
        import hydra

        self.name, where = name, f"reward.custom.{name}"
        spec = dict(spec or {})
        target, weight = spec.pop("_target_", None), spec.pop("weight", None)
        if spec:
            raise UserError(f"{where}.{sorted(spec)[0]}: a custom reward names only _target_ and weight")
        if not isinstance(target, str) or not target:
            raise UserError(f"{where} names no _target_: give the function's dotted path, e.g. "
                            f"+{where}._target_=mypackage.rewards.my_reward")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
            raise UserError(f"{where}.weight={weight!r}: a weight is a number from 0 up (e.g. +{where}.weight=0.5)")
        try:
            fn = hydra.utils.get_object(target)
        except Exception as err:  # an import error of the user's module, or a missing name: said as one line
            raise UserError(f"{where}._target_={target} cannot be imported ({' '.join(str(err).split())[:160]}): "
                            "give a function's dotted path on the Python path") from None
        if not callable(fn):
            raise UserError(f"{where}._target_={target} is a {type(fn).__name__}, not a function: give a function "
                            "fn(completion, gold, task) -> float")
        self.fn, self.weight, self.target = fn, float(weight), target

    def __call__(self, completion: str, gold: str, task: str) -> float:
        value = self.fn(completion, gold, task)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"reward.custom.{self.name} ({self.target}) returned {str(value)[:60]!r} for a {task} "
                            "completion: a reward function returns a finite number")
        return float(value)


class Rewards:
    """The reward of a completion for its task: 0 unless it is well formed, else the weighted sum of its family's
    terms and the user's own (`weights`: conf/reward/'s `families`, per-task `tasks` and `custom`, the weights
    numbers from 0 up as the config check has found them); each family, task and term they name is checked here,
    against the run's task table. Built once per command and handed to what rewards (the GRPO module, the
    validation)."""

    def __init__(self, weights: Mapping[str, Any], tasks: TaskTable, trained: Optional[list[str]] = None) -> None:
        self.tasks = tasks
        families, by_task = dict(weights.get("families") or {}), dict(weights.get("tasks") or {})
        for name, own in families.items():
            if name not in TERMS:
                raise UserError(f"reward.families.{name} is no metric family: the families are {', '.join(TERMS)}")
            _check_terms(name, own, f"reward.families.{name}", f"{name} family")
        for name, own in by_task.items():  # a task this run does not train is checked too: a typo is a typo
            kind = tasks.task(name, f"reward.tasks.{name}").family
            _check_terms(kind, own, f"reward.tasks.{name}", f"{kind} family ({name})")
        self.custom = [CustomTerm(name, spec) for name, spec in dict(weights.get("custom") or {}).items()]
        self.weights: dict[str, dict[str, float]] = {}
        for task in trained if trained is not None else list(tasks):
            kind = tasks.task(task).family
            own = {**dict(families.get(kind) or {}), **dict(by_task.get(task) or {})}
            if not any(own.values()) and not any(c.weight for c in self.custom):
                raise UserError(f"every reward weight of task {task} ({kind} family) is 0 or unset: GRPO would learn "
                                f"nothing from it; give one, e.g. reward.families.{kind}.format=0.1")
            self.weights[task] = {term: float(w) for term, w in own.items() if w}

    def term_names(self, task: str) -> list[str]:
        """The terms a completion of `task` is paid by, in the order `terms` gives them."""
        return [*self.weights[task], *(c.name for c in self.custom if c.weight)]

    def terms(self, task: str, completion: str, golds, ended: bool = True) -> dict[str, float]:
        """Each weighted term's value for `completion` (the generated response) of a `task` sample: in [0, 1] for
        the built-in terms, all 0 when it is not well formed; `ended`: its end of sequence came within its bound."""
        row = self.tasks.task(task)
        answer = well_formed(completion, row.answer_tag, ended)
        if answer is None:
            return dict.fromkeys(self.term_names(task), 0.0)
        golds = [g.strip() for g in ([golds] if isinstance(golds, str) else list(golds)) if isinstance(g, str)]
        stats = sample_stats(task, [completion], golds, tasks=self.tasks)
        judged = family(task, self.tasks).judge(stats) if stats["num_no_answer"] == 0 else ("no_answer", None)
        read = Answer(answer, stats, judged, golds)
        kind = TERMS[row.family]
        values = {term: float(kind[term](read)) for term in self.weights[task]}
        gold = golds[0] if golds else ""
        values.update({c.name: c(completion, gold, task) for c in self.custom if c.weight})
        return values

    def __call__(self, task: str, completion: str, golds, ended: bool = True) -> tuple[float, dict[str, float]]:
        """The reward of `completion` and each term's value."""
        values = self.terms(task, completion, golds, ended)
        weights = {**self.weights[task], **{c.name: c.weight for c in self.custom}}
        return sum(weights[term] * value for term, value in values.items()), values

    def probe(self, examples: Mapping[str, tuple[str, list[str]]]) -> None:
        """Call every reward function once per task on (`completion`, golds) before training: a user's function that
        raises or returns no number is one line now, not at the first rollout."""
        for task, (completion, golds) in examples.items():
            for custom in self.custom:
                try:
                    custom(completion, golds[0] if golds else "", task)
                except UserError:
                    raise
                except Exception as err:
                    raise UserError(f"reward.custom.{custom.name} ({custom.target}) raised {type(err).__name__} on a "
                                    f"{task} answer ({' '.join(str(err).split())[:120]}): fix the function") from None


def _check_terms(kind: str, weights, where: str, whose: str) -> None:
    for term in dict(weights or {}):
        if term not in TERMS[kind]:
            raise UserError(f"{where}.{term}: {term} is no reward term of the {whose}: its terms are "
                            f"{', '.join(TERMS[kind])}")


def check_rewards(cfg, tasks: Optional[TaskTable] = None) -> Optional[Rewards]:
    """objective=grpo: the run's `Rewards`, every weight of every task it trains checked before anything is built
    (`tasks`: the config's task table, read here when not given); None for another objective."""
    if cfg.objective.name != "grpo":
        return None
    tasks = tasks if tasks is not None else check_config(cfg).tasks
    key = (json.dumps(OmegaConf.to_container(cfg.reward, resolve=True), sort_keys=True), tasks, cfg.data.get("tasks"))
    if _BUILT and _BUILT[0] == key:
        return _BUILT[1]
    _BUILT[:] = key, Rewards(cfg.reward, tasks, key[2])
    return _BUILT[1]


# The command line's check (before Hydra) builds the run's rewards and the run inside Hydra takes the same object.
_BUILT: list = []
