"""The 14 SMolInstruct tasks and what each one is: one row per task, the only place these facts live.

A task's row says its name (as in the official archive), its metric family (`llasmol.metrics.families`), the tag its answer sits in, whether golds are pooled over samples
that share an input, the metric the paper's main tables report first, the group of related tasks whose
samples must share a split, its sample counts in the paper's Table 1, and what its core input is (a
SMILES, an IUPAC name or free text: what a non-LLM baseline can read). Adding a SMolInstruct task is one row
here, plus its beam settings in `conf/generation/paper.yaml`.

A user's own task (`data.new_tasks`, conf/data/custom.yaml) is a row made from its declaration (its family,
tags, headline metric, pooling, beams) in a `TaskTable`: an immutable table of the 14 and a run's own tasks,
made by the config check (`llasmol.core.schema.checked_tasks`) or from a run's `tasks.json`
(`llasmol.core.run_dir.read_tasks`) and handed to what reads tasks. Nothing in this module changes after import:
`SMOLINSTRUCT` is the table with nothing declared, and `get_task` looks up SMolInstruct's 14 alone. A table also
says how its answers are read (`Scoring`, the `scoring` config group), so the scorer it is handed reads them so.

Pooling follows the official scorer (LLM4Chem config.py `TASKS_WITH_READING_GOLD_FROM_DATASET`): for the
generation tasks any gold of the samples with the same core input (and target) is right; property tasks
are scored against each sample's own label (pooling SIDER would let one answer count for another side
effect of the same molecule).

Split groups follow the paper's Section 4.2 ("Data Splitting"): samples of related tasks that describe the
same reaction (FS and RS, `REACTION`) or the same molecule (MC and MG; the four NC tasks) are placed in the
same split, so that a reaction or molecule seen in training is never asked about in evaluation by its
reverse task. `llasmol.leakage` checks a copy of the data against this.

Counts are Table 1's #Train, #Valid, #Test (samples: SIDER counts one per molecule and side effect), as
the LLM4Chem project page prints the table (its statistics image). The first arXiv version's Table 1
has other train/valid counts for 9 tasks (NC-I2S, NC-S2F, NC-S2I, ClinTox, HIV, MC, MG, FS and RS: e.g. 300,000
train samples for each NC task where the page has 299,890 for all but I2F, 988,626 for FS); its test column is cut
off in our text of it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

from llasmol.core.errors import UserError


@dataclass(frozen=True)
class Task:
    name: str
    family: str  # smiles | formula | iupac | number | boolean | caption
    answer_tag: Optional[str]  # the response wraps its answer in <TAG> ... </TAG>; None: the whole response
    pooled: bool
    headline: str
    split_group: Optional[str]  # related tasks whose samples of one molecule/reaction share a split
    paper_counts: Optional[tuple[int, int, int]]  # Table 1: train, validation, test samples; None: a user's task
    input_kind: str  # smiles | iupac | text: the core input (reactions are '.'-joined SMILES)
    # A declared task's own beams (num_beams, num_return_sequences, max_new_tokens as (key, value) pairs);
    # a SMolInstruct task's are in conf/generation/paper.yaml.
    generation: tuple = ()

    @property
    def in_smolinstruct(self) -> bool:
        """Whether this is one of SMolInstruct's 14 tasks (not a user's own, declared in `data.new_tasks`)."""
        return self.paper_counts is not None

    @property
    def input_tag(self) -> Optional[str]:
        """The tag the core input is wrapped in (`SMILES`, `IUPAC`); None for text."""
        return _INPUT_TAGS[self.input_kind]

    def core_tags(self) -> dict[str, list[Optional[str]]]:
        """The tags around the core input and output as the official archive's `core_tag/<task>.json` holds them,
        e.g. {"input": ["<IUPAC>", "</IUPAC>"], "output": ["<MOLFORMULA>", "</MOLFORMULA>"]}."""
        return {"input": tag_pair(self.input_tag), "output": tag_pair(self.answer_tag)}


_INPUT_TAGS = {"smiles": "SMILES", "iupac": "IUPAC", "text": None}


def tag_pair(tag: Optional[str]) -> list[Optional[str]]:
    """The opening and closing forms of `tag` (`["<SMILES>", "</SMILES>"]`); `[None, None]` for no tag."""
    return [f"<{tag}>", f"</{tag}>"] if tag else [None, None]


REACTION = "reaction"  # the split group of FS and RS: one reaction, read forwards and backwards


TASKS: tuple[Task, ...] = (
    Task("forward_synthesis", "smiles", "SMILES", True, "exact_match", REACTION, (971_809, 2_049, 4_062), "smiles"),
    Task("retrosynthesis", "smiles", "SMILES", True, "exact_match", REACTION, (941_735, 2_092, 4_156), "smiles"),
    Task("molecule_captioning", "caption", None, True, "meteor", "description", (56_498, 1_269, 2_538), "smiles"),
    Task("molecule_generation", "smiles", "SMILES", True, "exact_match", "description", (56_498, 1_269, 2_493),
         "text"),
    Task("name_conversion-i2f", "formula", "MOLFORMULA", True, "exact_match", "name", (300_000, 1_497, 2_993), "iupac"),
    Task("name_conversion-i2s", "smiles", "SMILES", True, "exact_match", "name", (299_890, 1_496, 2_993), "iupac"),
    Task("name_conversion-s2f", "formula", "MOLFORMULA", True, "exact_match", "name", (299_890, 1_496, 2_993),
         "smiles"),
    Task("name_conversion-s2i", "iupac", "IUPAC", True, "exact_match", "name", (299_890, 1_496, 2_993), "smiles"),
    Task("property_prediction-esol", "number", "NUMBER", False, "rmse", None, (888, 111, 112), "smiles"),
    Task("property_prediction-lipo", "number", "NUMBER", False, "rmse", None, (3_360, 420, 420), "smiles"),
    Task("property_prediction-bbbp", "boolean", "BOOLEAN", False, "accuracy", None, (1_569, 196, 197), "smiles"),
    Task("property_prediction-clintox", "boolean", "BOOLEAN", False, "accuracy", None, (1_144, 143, 144), "smiles"),
    Task("property_prediction-hiv", "boolean", "BOOLEAN", False, "accuracy", None, (32_864, 4_104, 4_107), "smiles"),
    Task("property_prediction-sider", "boolean", "BOOLEAN", False, "accuracy", None, (22_820, 2_860, 2_860), "smiles"),
)

TASK_NAMES: tuple[str, ...] = tuple(t.name for t in TASKS)
PAPER_TOTALS = (3_288_855, 20_498, 33_061)  # Table 1's "Overall" row: the rows above add up to it
_SMOLINSTRUCT = {t.name: t for t in TASKS}
assert len(_SMOLINSTRUCT) == len(TASKS)

FAMILY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(t.family for t in TASKS))
INPUT_KINDS: tuple[str, ...] = tuple(_INPUT_TAGS)
# A declared task's answer tag and headline metric unless it names its own: those of the family's first task.
_FAMILY_DEFAULTS = {family: next(t for t in TASKS if t.family == family) for family in FAMILY_NAMES}
# What a declaration may say: the row's facts, the beams, and how its data is read (`llasmol.data.custom`).
# (tests/test_custom_data.py holds these the fields of `llasmol.core.schema.NewTaskSchema`, which types them)
_BEAM_KEYS = ("num_beams", "num_return_sequences", "max_new_tokens", "early_stopping")
DECLARATION_KEYS = ("family", "headline", "answer_tag", "input_kind", "pooled", "query", "response", *_BEAM_KEYS)
# The different golds one input of a pooled task may gather. Each answer is compared with every gold of its input
# (identity, then three fingerprints for SMILES) and every prediction record carries its input's golds, so time and
# file size grow as samples x golds of one input: 4,000 samples of one input, each with its own gold, took 77 s
# to score; 20,000 would take hours and write gigabytes. The bound keeps a sample's cost at milliseconds.
MAX_POOLED_GOLDS = 1_000
SMOLINSTRUCT_WEIGHT = "smolinstruct"  # data.weights' key for every SMolInstruct task not named on its own
_TAG = re.compile(r"[A-Z][A-Z0-9_]{0,31}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


# What chat templates put around a turn (Llama/Mistral's <s>[INST] ... [/INST] ... </s>, ChatML's and Llama 3's
# <|...|>, Gemma's <start_of_turn>): a query or response holding one would open or close a turn inside itself.
_CHAT_MARKER = re.compile(r"</?s>|\[/?INST\]|<\|[a-z_]+\|>|<(?:start|end)_of_turn>|<(?:bos|eos|pad|unk|mask)>")


def _folded(name: str) -> str:
    return name.replace("-", "_").casefold()


def declaration_problem(name: Any, decl: Any, beside: Iterable[str] = ()) -> Optional[str]:
    """What is wrong with declaring task `name` as `decl` beside the tasks named `beside` (one sentence naming
    the key), None if nothing is. Types and bounds of the beams are the schema's (`NewTaskSchema`); this says
    what a row needs."""
    where = f"data.new_tasks.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return (f"data.new_tasks names a task {str(name)[:40]!r}: a task name is letters, digits, '_' or '-' (at "
                "most 64, starting with a letter or digit)")
    if name in _SMOLINSTRUCT or name == SMOLINSTRUCT_WEIGHT:
        return (f"{where}: {name} is a SMolInstruct task name (or data.weights' word for all of them): give your task "
                "another name")
    # Metric states and logger keys write '-' as '_': two names that meet so would share their sums.
    # Nor may two names differ only by letter case: one person's SMILES task is another's.
    twin = next((t for t in (*TASK_NAMES, *beside) if t != name and _folded(t) == _folded(name)), None)
    if twin is not None:
        return (f"{where}: {name} and the task {twin} differ only by letter case or '-' and '_': give your task "
                "another name")
    if not isinstance(decl, Mapping):
        return f"{where} must be a mapping with at least family: one of {', '.join(FAMILY_NAMES)}"
    unknown = [k for k in decl if k not in DECLARATION_KEYS]
    if unknown:
        return f"{where}.{unknown[0]} is no setting of a task: a task declares {', '.join(DECLARATION_KEYS)}"
    family = decl.get("family")
    if family not in FAMILY_NAMES:
        return (f"{where}.family={family!r} must be one of {', '.join(FAMILY_NAMES)} (how answers are read and "
                "scored)")
    tag = decl.get("answer_tag", _FAMILY_DEFAULTS[family].answer_tag)
    if tag is not None and not (isinstance(tag, str) and _TAG.fullmatch(tag)):
        return (f"{where}.answer_tag={str(tag)[:40]!r} must be an upper-case tag name such as NUMBER (the answer "
                "is written <NUMBER> ... </NUMBER>) or null for the whole response")
    if "answer_tag" in decl and tag is None and decl.get("response") not in (None, "<OUTPUT>"):
        return (f"{where}.answer_tag=null reads the whole response as the answer, so response="
                f"{str(decl['response'])[:40]!r} could never be right: leave response out, or give an answer_tag")
    if decl.get("input_kind", "smiles") not in INPUT_KINDS:
        return f"{where}.input_kind={decl.get('input_kind')!r} must be one of {', '.join(INPUT_KINDS)}"
    headline = decl.get("headline")
    if headline is not None and not isinstance(headline, str):
        return f"{where}.headline={headline!r} must be a metric name of the {family} family"
    for key, placeholder in (("query", "<INPUT>"), ("response", "<OUTPUT>")):
        value = decl.get(key)
        texts = value if isinstance(value, list) else [value]
        if value is not None and not (texts and all(isinstance(t, str) and placeholder in t for t in texts)):
            return (f"{where}.{key} must be a text with {placeholder} (or a list of such texts, one drawn per "
                    f"sample){'' if key == 'response' else ', or null for the input as the whole query'}")
        marker = next((m.group() for t in texts if isinstance(t, str) for m in [_CHAT_MARKER.search(t)] if m), None)
        if marker is not None:
            return (f"{where}.{key} holds {marker!r}, a chat-template marker: the prompt puts the markers around the "
                    "query and the answer itself, and one inside would open or close a turn there; write the text "
                    "without it")
    return None


def _row(name: str, decl: Mapping) -> Task:
    family = decl["family"]
    like = _FAMILY_DEFAULTS[family]
    # pooled as its family's SMolInstruct tasks are: the official scorer pools the golds of one input for every
    # SMILES, formula, IUPAC and caption task (utils/metrics.py), not for numbers and yes/no labels
    return Task(name, family, decl.get("answer_tag", like.answer_tag), bool(decl.get("pooled", like.pooled)),
                decl.get("headline") or like.headline, None, None, decl.get("input_kind", "smiles"),
                tuple((k, decl[k]) for k in _BEAM_KEYS if decl.get(k) is not None))


def _scored(task: Task) -> dict:
    """What reading and scoring a task's answers depends on: its row without its beams."""
    return {"family": task.family, "answer_tag": task.answer_tag, "pooled": task.pooled, "headline": task.headline,
            "input_kind": task.input_kind}


@dataclass(frozen=True)
class Scoring:
    """How a run's answers are read (the `scoring` config group, conf/scoring/): each reading the official
    scorer's unless relaxed or tightened on request. It travels with the task table the scorer is handed."""

    lenient_formulas: bool = False  # formula syntax forgiven (`llasmol.metrics.formula`)
    lenient_booleans: bool = False  # one trailing period dropped from a yes/no answer
    strict_smiles: bool = False  # whitespace inside a SMILES part makes it invalid (`llasmol.metrics.molecules`)

    @classmethod
    def of(cls, settings: Optional[Mapping]) -> "Scoring":
        """The readings a `scoring` group's settings ask for (checked by the schema); a setting not given is
        the official scorer's reading."""
        settings = settings or {}
        return cls(**{f: bool(settings.get(f, False)) for f in cls.__dataclass_fields__})


OFFICIAL = Scoring()  # the official scorer's readings


def too_many_golds(task: Task, raw_input: Any, where: str) -> UserError:
    """The refusal of an input of pooled `task` whose different golds pass `MAX_POOLED_GOLDS` (at `where`)."""
    shown = str(raw_input) if len(str(raw_input)) <= 60 else str(raw_input)[:57] + "..."
    fix = ("leave out samples of that input" if task.in_smolinstruct else
           f"score each sample against its own gold (+data.new_tasks.{task.name}.pooled=false) or leave samples out")
    return UserError(f"{where}: the input {shown!r} of task {task.name} has more than {MAX_POOLED_GOLDS:,} different "
                     f"golds, which every answer to it would be scored against: {fix}")


def _look_alike(name: str, known: Iterable[str]) -> Optional[str]:
    """The name of `known` that `name` becomes once Unicode's compatibility forms (full-width letters), invisible
    characters (zero-width spaces, soft hyphens), case and surrounding spaces are set aside; None if none."""
    plain = "".join(c for c in unicodedata.normalize("NFKC", name) if unicodedata.category(c) not in ("Cf", "Cc"))
    plain = plain.strip().casefold()
    return next((k for k in known if k.casefold() == plain), None)


class TaskTable(Mapping):
    """The tasks one run knows, by name: SMolInstruct's 14 (table order), then the run's own declared ones
    (`data.new_tasks`). A value: made once from a config or a run's `tasks.json` and handed to whatever reads
    tasks (the data source, the evaluation pipeline, the scorer, the report); `with_declared` returns a new
    table and changes none. Two runs read in one process hold two tables and never see each other's tasks."""

    __slots__ = ("_rows", "_declared", "scoring")

    def __init__(self, declarations: Optional[Mapping[str, Mapping]] = None, scoring: Scoring = OFFICIAL) -> None:
        rows, declared = dict(_SMOLINSTRUCT), {}
        for name, decl in (declarations or {}).items():
            problem = declaration_problem(name, decl, declarations or {})
            if problem:
                raise UserError(problem)
            declared[name] = dict(decl)
            rows[name] = _row(name, declared[name])
        self._rows: dict[str, Task] = rows
        self._declared: dict[str, dict] = declared
        self.scoring = scoring  # how the tasks' answers are read (`Scoring`)

    def __getitem__(self, name: str) -> Task:
        return self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskTable) and (self._declared, self.scoring) == (other._declared, other.scoring)

    def __hash__(self) -> int:
        return hash((tuple(self._declared), self.scoring))

    def __repr__(self) -> str:
        return f"TaskTable(declared={list(self._declared)}, scoring={self.scoring})"

    @property
    def declared(self) -> dict[str, dict]:
        """The declarations of the table's own tasks, by name, as given (a copy)."""
        return {name: dict(decl) for name, decl in self._declared.items()}

    def with_declared(self, declarations: Optional[Mapping[str, Mapping]]) -> "TaskTable":
        """This table and the tasks of `declarations` (runs read together). A task declared again is the same
        task, its first declaration kept, when it is scored alike (runs may ask it with other templates or
        beams); scored otherwise, a `UserError`."""
        merged = self.declared
        for name, decl in (declarations or {}).items():
            if name in merged:
                known, row = self._rows[name], TaskTable({name: decl})[name]  # checked as any declaration
                if _scored(known) != _scored(row):
                    raise UserError(f"task {name} is declared twice, scored differently ({_scored(known)} and "
                                    f"{_scored(row)}): runs read together must mean one task by one name; rename "
                                    "the task in one of them")
                continue
            merged[name] = decl
        return TaskTable(merged, self.scoring)

    def with_scoring(self, scoring: Scoring) -> "TaskTable":
        """This table with its answers read as `scoring` says."""
        return self if scoring == self.scoring else TaskTable(self._declared, scoring)

    def task(self, name: str, where: str = "the task name") -> Task:
        """The row of task `name`, spelt exactly as the table spells it (a name that only looks like one is
        refused, so no two spellings ever count as one task or as two); the one unknown-task error, naming
        `where` the name came from."""
        try:
            return self._rows[name]
        except (KeyError, TypeError):
            alike = _look_alike(name, self._rows) if isinstance(name, str) else None
            if alike is not None:
                raise UserError(f"unknown task {ascii(name)} in {where}: it looks like {alike} but is spelt with "
                                f"other characters; write {alike}") from None
            own = " (or declare your own in data.new_tasks)" if not self._declared else ""
            raise UserError(f"unknown task {name!r} in {where}: choose from " + ", ".join(self._rows) + own) from None

    def check(self, names: Iterable[str], where: str = "data.tasks") -> list[str]:
        """`names` as a list, each a task of this table, none twice, at least one."""
        names = list(names)
        if not names:
            raise UserError(f"{where} is empty: name at least one of " + ", ".join(self._rows))
        for name in names:
            self.task(name, where)
        if len(set(names)) != len(names):
            raise UserError(f"{where} lists a task twice: {names}")
        return names

    def answer_tags(self) -> tuple[str, ...]:
        """The tags any answer may sit in: each task's, in table order, and SELFIES for
        `data.representation=selfies`."""
        return tuple(dict.fromkeys([*filter(None, (t.answer_tag for t in self._rows.values())), "SELFIES"]))


SMOLINSTRUCT = TaskTable()  # SMolInstruct's 14 tasks and nothing declared: what a command without own tasks knows


def get_task(name: str, where: str = "the task name") -> Task:
    """The row of SMolInstruct task `name` (`TaskTable.task` of `SMOLINSTRUCT`): for code that reads
    SMolInstruct alone (the archive's reader, the leakage audit, the classical baselines' SMolInstruct rows)."""
    return SMOLINSTRUCT.task(name, where)
