"""Answer extraction: the core answer of a model response, found between the task's answer tags.

SMolInstruct responses wrap the answer in a tag pair with spaces inside, e.g.
``"The product is <SMILES> CC(=O)O </SMILES> ."``.  The rule here:

- the answer is the text of the first *complete* tag pair: the first closing tag that has an
  opening tag somewhere before it, paired with the nearest such opening tag (so in
  ``"<SMILES> a <SMILES> b </SMILES>"`` the answer is ``"b"``: a pair never contains a tag);
- the text is stripped of surrounding whitespace; tags are matched exactly (case-sensitive);
- no complete pair, or an empty pair, means no answer (``None``);
- molecule_captioning has no tag: the whole response, stripped, is the answer (empty -> ``None``).

Non-string input (e.g. ``None``) is no answer rather than an error, so model output never
crashes scoring.
"""

from __future__ import annotations

ANSWER_TAG: dict[str, str | None] = {
    "forward_synthesis": "SMILES",
    "retrosynthesis": "SMILES",
    "molecule_generation": "SMILES",
    "name_conversion-i2s": "SMILES",
    "name_conversion-i2f": "MOLFORMULA",
    "name_conversion-s2f": "MOLFORMULA",
    "name_conversion-s2i": "IUPAC",
    "property_prediction-esol": "NUMBER",
    "property_prediction-lipo": "NUMBER",
    "property_prediction-bbbp": "BOOLEAN",
    "property_prediction-clintox": "BOOLEAN",
    "property_prediction-hiv": "BOOLEAN",
    "property_prediction-sider": "BOOLEAN",
    "molecule_captioning": None,
}


def _tag(task: str) -> str | None:
    try:
        return ANSWER_TAG[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}: choose from {', '.join(ANSWER_TAG)}") from None


def extract_answer(task: str, text: str) -> str | None:
    """The core answer in `text` for `task`, stripped; ``None`` when there is none.

    Raises ``ValueError`` only for an unknown task name (a caller bug, not model output).
    """
    tag = _tag(task)
    if not isinstance(text, str):
        return None
    if tag is None:
        answer = text.strip()
        return answer or None
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
