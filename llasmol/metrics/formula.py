r"""Molecular formula parsing: two formulas match when they parse to the same key.

Two syntaxes, chosen by the scoring setting ``scoring.lenient_formulas`` (`formula_key`):

**official** (the default, the paper's configuration): as the official scorer, LLM4Chem
``utils/metrics.py`` ``parse_molecule`` (lines 270-321). A formula is valid only when it matches
``([A-Za-z]\d*)+([+-]\d*)*$`` from its first character (letters with counts, then charges: no spaces,
brackets, dots or leading multipliers). Its key counts each ``[A-Z][a-z]?`` symbol with its count, read
left to right until a character starts no symbol (so ``c2h6o`` is valid with no atoms, and any capitalised
pair such as ``Xx`` counts as an element), plus the *first* charge's sign and size (``C2H3O2-`` and
``C2H3O2-1`` are one key). `parse_formula_official`.

**lenient** (`parse_formula`), accepted syntax (whitespace anywhere is ignored):

- elements ``C``, ``Cl``, ... each with an optional count (``C2H6O``); order does not matter,
  so ``C2H6O == H6C2O == CH3CH2OH``; counts of 0 drop out; only the 118 element symbols, plus
  ``D`` and ``T`` read as hydrogen-2 and hydrogen-3;
- isotopes in brackets, ``[13C]`` / ``[2H]2``: an isotope is a different atom from the plain
  element (RDKit's ``CalcMolFormula``, which made the golds, folds isotopes into the element
  unless asked not to, so plain golds only match plain predictions);
- groups in parentheses with a multiplier, ``(CH3)3N``;
- components separated by ``'.'`` or ``'·'``, each with an optional leading multiplier
  (``C2H6O.2H2O``), summed;
- a charge at the end of a component: ``+``, ``-``, ``+2``, ``-3``, ``++`` (as ``CalcMolFormula``
  writes ``C2H3O2-`` or ``Fe+3``); the total charge must match as well.

Anything else (unknown symbols, unbalanced parentheses, junk) does not parse: ``None``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Hashable, Optional

ELEMENTS = frozenset(
    """H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As
    Se Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd
    Tb Dy Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am
    Cm Bk Cf Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og""".split()
)
_HYDROGEN_ISOTOPES = {"D": 2, "T": 3}

MAX_FORMULA_CHARS = 1000

_CHARGE = re.compile(r"(?:[+-]\d+|[+-]+)$")
_MULTIPLIER = re.compile(r"^(\d+)")
_TOKEN = re.compile(
    r"\[(?P<mass>\d+)(?P<iso>[A-Z][a-z]?)\](?P<isocount>\d*)"
    r"|(?P<el>[A-Z][a-z]?)(?P<count>\d*)"
    r"|(?P<open>\()"
    r"|\)(?P<groupcount>\d*)"
)

Atom = tuple[str, int]  # (element, mass number; 0 for the natural element)
Formula = tuple[frozenset[tuple[Atom, int]], int]  # (atom counts, total charge)


def _parse_charge(text: str) -> int:
    sign = 1 if text[0] == "+" else -1
    if len(text) > 1 and text[1:].isdigit():
        return sign * int(text[1:])
    return sign * len(text)


def _parse_component(text: str) -> tuple[Counter, int] | None:
    charge = 0
    match = _CHARGE.search(text)
    if match:
        charge = _parse_charge(match.group(0))
        text = text[: match.start()]
    multiplier = 1
    match = _MULTIPLIER.match(text)
    if match:
        multiplier = int(match.group(1))
        text = text[match.end() :]
    if not text:
        return None
    stack: list[Counter] = [Counter()]
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            return None
        pos = match.end()
        if match.group("iso"):
            symbol, mass = match.group("iso"), int(match.group("mass"))
            if symbol not in ELEMENTS or mass == 0:
                return None
            stack[-1][(symbol, mass)] += int(match.group("isocount") or 1)
        elif match.group("el"):
            symbol = match.group("el")
            if symbol in _HYDROGEN_ISOTOPES:
                atom = ("H", _HYDROGEN_ISOTOPES[symbol])
            elif symbol in ELEMENTS:
                atom = (symbol, 0)
            else:
                return None
            stack[-1][atom] += int(match.group("count") or 1)
        elif match.group("open"):
            stack.append(Counter())
        else:  # closing parenthesis
            if len(stack) == 1:
                return None
            group = stack.pop()
            factor = int(match.group("groupcount") or 1)
            for atom, count in group.items():
                stack[-1][atom] += count * factor
    if len(stack) != 1:
        return None
    counts = Counter({atom: count * multiplier for atom, count in stack[0].items()})
    return counts, charge * multiplier


def parse_formula(text: str | None) -> Formula | None:
    """Atom counts and total charge of a formula; ``None`` when it does not parse."""
    if not isinstance(text, str) or len(text) > MAX_FORMULA_CHARS:
        return None
    text = "".join(text.split())
    if not text:
        return None
    total: Counter = Counter()
    charge = 0
    for component in re.split(r"[.·]", text):
        parsed = _parse_component(component)
        if parsed is None:
            return None
        counts, component_charge = parsed
        total.update(counts)
        charge += component_charge
    atoms = frozenset((atom, count) for atom, count in total.items() if count != 0)
    if not atoms:
        return None
    return atoms, charge


# LLM4Chem utils/metrics.py:271 (validity), :283 (an element and its count), :311 (the charge).
_OFFICIAL_VALID = re.compile(r"([A-Za-z]\d*)+([\+\-]\d*)*$")
_OFFICIAL_ATOM = re.compile(r"([A-Z][a-z]?)(\d+)?")
_OFFICIAL_CHARGE = re.compile(r"[\+\-]\d*")


def parse_formula_official(text: str | None) -> Optional[frozenset[tuple[str, int]]]:
    """The official scorer's key of a formula (see the module's docstring); ``None`` when it calls the
    formula invalid. Counts add up as the official dictionary does (``CH3CH2OH`` is ``C2H6O``), and a
    count of 0 stays a key of its own (``C2H6ON0`` is not ``C2H6O``)."""
    if not isinstance(text, str) or len(text) > MAX_FORMULA_CHARS or _OFFICIAL_VALID.match(text) is None:
        return None
    counts: Counter = Counter()
    seen: dict[str, None] = {}
    pos = 0
    while pos < len(text) and (match := _OFFICIAL_ATOM.match(text, pos)):
        symbol = match.group(1)
        counts[symbol] += int(match.group(2) or 1)
        seen[symbol] = None
        pos = match.end()
    key = {symbol: counts[symbol] for symbol in seen}
    charge = _OFFICIAL_CHARGE.search(text)
    if charge is not None:
        key[charge.group()[0]] = int(charge.group()[1:]) if len(charge.group()) > 1 else 1
    return frozenset(key.items())


def formula_key(text: str | None, lenient: bool = False) -> Optional[Hashable]:
    """What two matching formulas share: `parse_formula` (lenient) or `parse_formula_official`."""
    return parse_formula(text) if lenient else parse_formula_official(text)

