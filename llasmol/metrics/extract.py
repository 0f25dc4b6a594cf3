"""Answer extraction: the core answer of a model response, found between the task's answer tags.

SMolInstruct responses wrap the answer in a tag pair with spaces inside, e.g.
``"The product is <SMILES> CC(=O)O </SMILES> ."``.  The rule here:

- the answer is the text of the first *complete* tag pair: the first closing tag that has an
  opening tag somewhere before it, paired with the nearest such opening tag (so in
  ``"<SMILES> a <SMILES> b </SMILES>"`` the answer is ``"b"``: a pair never contains a tag);
- the text is stripped of surrounding whitespace; tags are matched exactly (case-sensitive);
- no complete pair, or an empty pair, means no answer (``None``);
- molecule_captioning has no tag: the whole response is the answer, with every ``<unk>`` and ``</s>`` taken
  out and stripped (empty -> ``None``), as the official `extract_prediction.py` reads an untagged output
  (lines 15-17: its outputs were decoded with the end-of-sequence and padding tokens kept);
- a leading ``<think>...</think>`` block (a reasoning model's thoughts; Qwen3 writes an empty one when asked
  without its block in the prompt) is not part of the answer, and a think block left open holds no answer.
  SMolInstruct responses never start with one, so the paper's scoring is unchanged.

Non-string input (e.g. ``None``) is no answer rather than an error, so model output never
crashes scoring.
"""

from __future__ import annotations

from llasmol.core.tasks import SMOLINSTRUCT, TaskTable

# What the official reader takes out of an untagged answer: end of sequence and padding (extract_prediction.py:16).
UNTAGGED_DROP: tuple[str, ...] = ("<unk>", "</s>")
# A reasoning model's thoughts, before its answer (Qwen3's chat template writes them so).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def extract_answer(task: str, text: str, tasks: TaskTable = SMOLINSTRUCT) -> str | None:
    """The core answer in `text` for `task` (a task of `tasks`), stripped; ``None`` when there is none.

    Raises a `UserError` only for a task name the task table lacks (never for model output).
    """
    tag = tasks.task(task).answer_tag
    if not isinstance(text, str):
        return None
    text = _after_reasoning(text)
    return untagged_answer(text) if tag is None else _between(text, tag)


def untagged_answer(text: str) -> str | None:
    """A caption's answer: the text without the special tokens a decoder may leave in it, stripped."""
    for token in UNTAGGED_DROP:
        text = text.replace(token, "")
    return text.strip() or None


def wrap_answer(task: str, answer: str, tasks: TaskTable = SMOLINSTRUCT) -> str:
    """A response carrying `answer` as SMolInstruct writes it (``<SMILES> CCO </SMILES>``; a caption as it
    is): what a system that is not a language model answers, so the same extraction reads it back."""
    tag = tasks.task(task).answer_tag
    return answer if tag is None else f"<{tag}> {answer} </{tag}>"


def _after_reasoning(text: str) -> str:
    """`text` after its leading think block, if it starts with one ("" when that block never closes)."""
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return text
    end = stripped.find(THINK_CLOSE)
    return "" if end == -1 else stripped[end + len(THINK_CLOSE):]


def _between(text: str, tag: str) -> str | None:
    opening, closing = f"<{tag}>", f"</{tag}>"
    # The first closing tag with an opening before it is the first one after the first opening; two
    # finds and one bounded rfind keep this linear in the text (a scan per closing tag was quadratic).
    first = text.find(opening)
    if first == -1:
        return None
    end = text.find(closing, first + len(opening))
    if end == -1:
        return None
    start = text.rfind(opening, first, end)
    answer = text[start + len(opening) : end].strip()
    return answer or None


def any_answer(text: str, tasks: TaskTable = SMOLINSTRUCT) -> str | None:
    """Without a task: the answer of the complete tag pair that closes first, whichever answer tag of `tasks`
    it is."""
    if not isinstance(text, str):
        return None
    text = _after_reasoning(text)
    found = []
    for tag in tasks.answer_tags():
        answer = _between(text, tag)
        if answer is not None:
            found.append((text.find(f"</{tag}>", text.find(f"<{tag}>")), answer))
    return min(found)[1] if found else None
