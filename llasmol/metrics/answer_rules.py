"""Answers of models that were never tuned on SMolInstruct: the paper's extraction rules, per model and task.

The paper reads the answers of Llama 2, Code Llama, Mistral, Galactica and Molinst "by heuristic rules and
regular expression matching" (App. A.2.2-A.2.4); the official repository ships those rules in
`prediction_extraction.py` (OSU-NLP-Group/LLM4Chem, functions `llama_*`, `codellama_*`, `mistral_*`, `gal_*`,
`mol_*`). The rules here behave as those functions, quirks included (the Llama forward-synthesis rule keeps
the text from the second character of its title on; Galactica's reaction rule drops the last character when
the closing tag is missing), because the paper's base rows were scored through them. Each is tested on
crafted outputs against the official functions' results (tests/data/answer_rules_cases.json).

Two differences, both on input the official code cannot score: where a Galactica or Molinst rule's title is
absent the official function stops the whole run (`assert`), here the sample has no answer; and
non-string output is no answer.

What a rule reads: `llama`, `codellama` and `mistral` rules read the response alone; `gal` and `mol` rules
read the prompt followed by the response (`TEXT_WITH_PROMPT`), as the official generation kept the prompt
in their outputs (Galactica's rules look for titles the query ends with; Molinst's reader starts after the
first ``Response:``).
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from llasmol.core.errors import UserError
from llasmol.core.tasks import TASK_NAMES

# One SMILES-looking run of characters, tried in the official alternation order: a lone bracket before a
# bracket atom, `Br` before `B`, `Cl` before `C` (prefix matches depend on that order).
_SMILES_RUN = re.compile(r"(?:[\[\]]|\[[^\]]+\]|Br?|Cl?|[HNOSPFIbcnosp().;=#\-+\\/:~@?>*$]|%[0-9]{2}|[0-9])+")

_RS_TITLES = (
    "Reactant SMILES:", "the predicted reactant molecules based on the product SMILES:",
    "Here are the predicted reactant molecules in SMILES format:", "Reactants SMILES:", "Reactants:",
    "the predicted reactants for the given product SMILES:",
    "Here are the predicted reactants for the given product molecule:", "following reactants:",
    "Here are the predicted reactants for the given product molecule using the SMILES representation:",
    "The predicted reactants for the given product molecule are:",
    "the predicted reactants based on the product SMILES:", "the predicted reactants for the given product:",
    "the predicted reactants for the given reaction:",
)
_RS_MULTI_TITLES = (
    "predicted reactants for each product SMILES:", "the predicted reactants for each product:",
    "the predicted reactants for each product molecule:",
    "Here are the predicted reactants for the given product molecules:",
)
_MG_TITLES = (
    "SMILES for the second molecule: ", "the second input:", " is:", "molecules:", "description:",
    "you described:", "SMILES:", "described in the input:", "Here is the SMILES representation of the molecule:",
    "you provided:", "the molecule is:",
)


class _NoTitle(Exception):
    """A Galactica/Molinst title is missing (the official function asserts): no answer."""


def _smiles_prefix(text: str) -> Optional[str]:
    m = _SMILES_RUN.match(text)
    return text[: m.end()] if m else None


def _is_smiles(text: str) -> bool:
    return _SMILES_RUN.fullmatch(text) is not None


def _first_line(text: str) -> str:
    cut = text.find("\n")
    return text if cut == -1 else text[:cut].strip()


def _after(text: str, title: str, last: bool = False, fold: bool = False) -> Optional[str]:
    """The text after the first (or `last`) occurrence of `title` (`fold`: case-insensitively), or None."""
    hay, needle = (text.lower(), title.lower()) if fold else (text, title)
    pos = hay.rfind(needle) if last else hay.find(needle)
    return None if pos == -1 else text[pos + len(title):]


def _require(text: str, title: str) -> str:
    rest = _after(text, title)
    if rest is None:
        raise _NoTitle(title)
    return rest


# Llama 2 --------------------------------------------------------------------------------------------------

def _llama_fs(text: str) -> str:
    text = text.strip()
    if _is_smiles(text):
        return text
    pos = text.rfind("Predicted product SMILES:")
    if pos != -1:
        return text[pos + 1:].strip()  # sic: one character past the title's start, as the official rule
    rest = _after(text, ":", last=True)
    if rest is not None and _smiles_prefix(rest.strip()) is not None:
        return _smiles_prefix(rest.strip())
    return _smiles_prefix(text) or ""


def _llama_rs(text: str) -> str:
    text = text.strip()
    m = _SMILES_RUN.match(text)
    if m is not None and (m.end() == len(text) or m.end() > 10):
        return text[: m.end()]
    found = False
    for title in _RS_TITLES:
        rest = _after(text, title, last=True, fold=True)
        if rest is not None:
            text, found = rest.strip(), True
            break
    if not found:
        for title in _RS_MULTI_TITLES:  # every title is tried in turn on what the previous ones left
            rest = _after(text, title, last=True, fold=True)
            if rest is not None:
                text = rest.strip()
                second = _after(text, "product 2:", fold=True)
                if second is not None:
                    text, found = second.strip().strip("*").strip(), True
    return (_smiles_prefix(text) or "") if found else ""


def _llama_mg(text: str) -> str:
    text = text.strip()
    line = _first_line(text)
    if _is_smiles(line):
        return line
    found = False
    for title in _MG_TITLES:
        rest = _after(text, title, fold=True)
        if rest is not None:
            text, found = rest.strip(), True
            break
    if not found:
        rest = _after(text, ":", last=True)
        if rest is not None:
            text, found = rest.strip(), True
    if not found:
        return ""
    if _smiles_prefix(text) is None:
        text = text[text.find(":") + 1:].strip()
    return _smiles_prefix(text) or ""


def _after_last_colon_line(text: str) -> str:
    """Llama's formula/name/ESOL rule: after the last colon, its first line, one final period dropped."""
    text = text.strip()
    rest = _after(text, ":", last=True)
    if rest is None:
        return text
    text = _first_line(rest.strip())
    return text[:-1] if text.endswith(".") else text


def _iupac(text: str) -> str:
    """The IUPAC-name rule Llama 2, Code Llama and Mistral share."""
    text = text.strip()
    for title in ("IUPAC:", "IUPAC name:", ":", " is "):
        rest = _after(text, title, last=True, fold=True)
        if rest is not None:
            text = rest.strip()
            break
    text = _first_line(text).strip().strip(".")
    return "" if text == "not provided" else text


def _llama_lipo(text: str) -> str:
    text = text.strip()
    rest = _after(text, ":", last=True)
    if rest is None:
        rest = _after(text, "=", last=True)
    return text if rest is None else _first_line(rest.strip())


def _stripped(text: str) -> str:
    return text.strip()


# Code Llama -----------------------------------------------------------------------------------------------

def _codellama_smiles(text: str) -> str:
    text = text.strip().strip(".")
    rest = _after(text, ":", last=True)
    if rest is None:
        return text
    text = rest.strip().strip(".")
    cut = text.find("\n")
    return text if cut == -1 else text[:cut].strip().strip(".")


# Mistral --------------------------------------------------------------------------------------------------

def _mistral_first_line(text: str) -> str:
    return text.strip().split("\n")[0].strip()


def _mistral_after_colon(text: str) -> str:
    text = text.strip()
    rest = _after(text, ":", last=True)
    return _first_line(text if rest is None else rest.strip())


def _mistral_lipo(text: str) -> str:
    text = text.strip()
    if "\n" in text:
        line = text[: text.find("\n")].strip()
        try:
            float(line)
            return line
        except ValueError:
            pass
    rest = _after(text, ":", last=True)
    if rest is None:
        rest = _after(text, "is ", last=True)
    if rest is not None:
        text = rest.strip().strip(".")
    return _first_line(text)


def _mistral_label(text: str) -> str:
    return text.strip().strip(".")


# Molinst (reads the text after the first "Response:") -----------------------------------------------------

def _mol_clean(text: str) -> str:
    return text.replace("<unk>", "").replace("</s>", "").strip()


def _mol_number(text: str) -> str:
    return _mol_clean(text).strip(".").strip()


def _mol_label(text: str) -> str:
    text = text.strip().lower()
    return "Yes" if text.startswith("yes") else "No" if text.startswith("no") else ""


def _mol(rule: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: rule(_require(text, "Response:").strip())


# Galactica (reads the prompt and the response) ------------------------------------------------------------

def _gal_reaction(text: str) -> str:
    text = _require(_require(text, "Answer:"), "[START_I_SMILES]")
    return text[: text.find("[END_I_SMILES]")].strip()  # sic: a missing end tag drops the last character


def _gal_caption(text: str) -> str:
    return _first_line(_require(text, "Description:").strip())


def _gal_until(text: str, end: str) -> str:
    cut = text.find(end)
    return text if cut == -1 else text[:cut].strip()


def _gal_mg(text: str) -> str:
    return _gal_until(_require(text, "The SMILES formula of this molecule is [START_I_SMILES]").strip(),
                      "[END_I_SMILES]")


def _gal_formula(text: str) -> str:
    return _gal_until(_require(text, "Molecular Formula").strip().strip("*").strip(), "\n")


def _gal_i2s(text: str) -> str:
    return _gal_until(_require(text, "Canonical SMILES\n\n[START_SMILES]"), "[END_SMILES]")


def _gal_s2i(text: str) -> str:
    text = _require(text, "The following are chemical properties for ")
    cut = text.find("\n")
    return text if cut == -1 else text[:cut].strip().strip(".").strip()


def _gal_property(text: str) -> str:
    text = _require(text, "Answer:")
    cut = text.find("\n")
    text = text if cut == -1 else text[:cut]
    return text.strip().replace("</s>", "").strip()


def _table(fs, rs, mc, mg, i2f, i2s, s2f, s2i, esol, lipo, label) -> dict[str, Callable[[str], str]]:
    """A rule set in the task table's order; one rule for the four yes/no tasks."""
    rules = (fs, rs, mc, mg, i2f, i2s, s2f, s2i, esol, lipo, label, label, label, label)
    return dict(zip(TASK_NAMES, rules))


RULES: dict[str, dict[str, Callable[[str], str]]] = {
    "llama": _table(_llama_fs, _llama_rs, _stripped, _llama_mg, _after_last_colon_line, _after_last_colon_line,
                    _after_last_colon_line, _iupac, _after_last_colon_line, _llama_lipo, _stripped),
    "codellama": _table(_codellama_smiles, _codellama_smiles, _stripped, _codellama_smiles, _after_last_colon_line,
                        _codellama_smiles, _after_last_colon_line, _iupac, _stripped, _stripped, _stripped),
    "mistral": _table(_mistral_first_line, _mistral_first_line, _stripped, _after_last_colon_line,
                      _mistral_first_line, _mistral_after_colon, _mistral_first_line, _iupac, _mistral_after_colon,
                      _mistral_lipo, _mistral_label),
    "gal": _table(_gal_reaction, _gal_reaction, _gal_caption, _gal_mg, _gal_formula, _gal_i2s, _gal_formula,
                  _gal_s2i, _gal_property, _gal_property, _gal_property),
    "mol": {task: _mol(rule) for task, rule in _table(
        _mol_clean, _mol_clean, _mol_clean, _mol_clean, _mol_clean, _mol_clean, _mol_clean, _mol_clean,
        _mol_number, _mol_number, _mol_label).items()},
}
# The rule sets that read the prompt followed by the response.
TEXT_WITH_PROMPT = frozenset({"gal", "mol"})


def check_rules(name: str) -> str:
    """`name` if it is a rule set, else the one-line error listing them."""
    if name not in RULES:
        raise UserError(f"prompting.rules={name!r} is not an extraction rule set: choose from "
                        + ", ".join(RULES) + " (or tags: the answer between the task's tags)")
    return name


def extract_base_answer(rules: str, task: str, text) -> Optional[str]:
    """The answer the official rule set `rules` reads for `task` in `text`; None when it reads nothing."""
    if not isinstance(text, str):
        return None
    try:
        answer = RULES[check_rules(rules)][task](text)
    except _NoTitle:
        return None
    return answer or None
