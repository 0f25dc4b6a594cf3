"""The 14 SMolInstruct tasks and what each one is: one row per task, the only place these facts live.

A task's row says its name (as in the official archive), its metric family (`llasmol.metrics.families`), the tag its answer sits in, whether golds are pooled over samples
that share an input, the metric the paper's main tables report first, the group of related tasks whose
samples must share a split, its sample counts in the paper's Table 1, and what its core input is (a
SMILES, an IUPAC name or free text: what a non-LLM baseline can read). Adding a task is one row here,
plus its beam settings in `conf/generation/paper.yaml`.

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
has other train/valid counts for 8 tasks (e.g. 300,000 train samples for each NC task, 988,626 for FS);
its test column is cut off in our text of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from llasmol.core.errors import UserError


@dataclass(frozen=True)
class Task:
    name: str
    family: str  # smiles | formula | iupac | number | boolean | caption
    answer_tag: Optional[str]  # the response wraps its answer in <TAG> ... </TAG>; None: the whole response
    pooled: bool
    headline: str
    split_group: Optional[str]  # related tasks whose samples of one molecule/reaction share a split
    paper_counts: tuple[int, int, int]  # Table 1: train, validation, test samples
    input_kind: str  # smiles | iupac | text: the core input (reactions are '.'-joined SMILES)

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
_BY_NAME = {t.name: t for t in TASKS}
assert len(_BY_NAME) == len(TASKS)


def _look_alike(name: str) -> Optional[str]:
    """The task name that `name` becomes once Unicode's compatibility forms (full-width letters), invisible
    characters (zero-width spaces, soft hyphens), case and surrounding spaces are set aside; None if none."""
    import unicodedata

    plain = "".join(c for c in unicodedata.normalize("NFKC", name) if unicodedata.category(c) not in ("Cf", "Cc"))
    plain = plain.strip().casefold()
    return plain if plain in _BY_NAME else None


def get_task(name: str, where: str = "the task name") -> Task:
    """The row of task `name`, spelt exactly as the table spells it (a name that only looks like one is
    refused, so no two spellings ever count as one task or as two); the one unknown-task error, naming
    `where` the name came from."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        alike = _look_alike(name) if isinstance(name, str) else None
        if alike is not None:
            raise UserError(f"unknown task {ascii(name)} in {where}: it looks like {alike} but is spelt with other "
                            f"characters; write {alike}") from None
        raise UserError(f"unknown task {name!r} in {where}: choose from " + ", ".join(TASK_NAMES)) from None


def check_tasks(names: Iterable[str], where: str = "data.tasks") -> list[str]:
    """`names` as a list, each a known task, none twice, at least one."""
    names = list(names)
    if not names:
        raise UserError(f"{where} is empty: name at least one of " + ", ".join(TASK_NAMES))
    for name in names:
        get_task(name, where)
    if len(set(names)) != len(names):
        raise UserError(f"{where} lists a task twice: {names}")
    return names

