"""The queries the paper asked models never tuned on SMolInstruct: one table per style, every task.

- `icl`: GPT-4's query templates, used for Llama 2, Code Llama and Mistral 1-shot (App. A.2.1, A.2.3). A query
  is Figure 3's four parts: a general template, a task-specific template (content and format
  requirements), k in-context examples as ``<input title>: <input content>`` / ``<output title>: <output
  content>`` lines, then the question in the same form with the output left empty.
- `galactica`: zero-shot in Galactica's own conventions (App. A.2.2): molecules inside
  ``[START_I_SMILES]``/``[END_I_SMILES]``, MoleculeNet questions as ``Question: ... Answer:``, names and
  formulas as PubChem-style sections. Each query ends with the title the official `gal_*` extraction rule
  looks for (`llasmol.metrics.answer_rules`).
- `molinst`: zero-shot in Mol-Instructions' Alpaca format (App. A.2.4): its instructions on MC, MG, FS and RS
  (as its README prints them), instructions in that style on the other tasks.

The paper prints only Figure 3's forward-synthesis template; every other row here is an approximation written
for this package in the same structure (`PRINTED` names the rows the paper prints). Galactica's and
Molinst's queries are not printed either: those here follow the conventions the paper names and end with
the titles of the official extraction rules. Molinst was trained on SELFIES; like the paper's text, these
queries give SMILES (the paper does not say it converted them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from llasmol.core.tasks import TASK_NAMES
from llasmol.data.formatting import PROMPT_TEMPLATES


@dataclass(frozen=True)
class IclTemplate:
    general: str
    specific: str
    input_title: str
    output_title: str  # may hold {target} (SIDER: the side effect asked about)


_CHEMIST = "You are an expert chemist. "
_VALID = " Your reply must be valid and chemically reasonable."
_YES_NO = "Your reply should be only \"Yes\" or \"No\" and no other text."
_NUMBER = "Your reply should contain only the predicted value, a single number, and no other text."


def _props(question: str) -> str:
    return f"{_CHEMIST}Given the SMILES representation of a molecule, your task is to {question} using your chemical knowledge."


ICL: dict[str, IclTemplate] = dict(zip(TASK_NAMES, (
    IclTemplate(  # Figure 3, as printed
        f"{_CHEMIST}Given the SMILES representation of reactants and reagents, your task is to predict the potential "
        "product using your chemical reaction knowledge.",
        "The input contains both reactants and reagents, and different reactants and reagents are separated by "
        "\".\". Your reply should contain only the SMILES representation of the predicted product and no other "
        "text." + _VALID,
        "Reactants and reagents SMILES", "Product SMILES"),
    IclTemplate(
        f"{_CHEMIST}Given the SMILES representation of a product, your task is to predict the potential reactants "
        "using your chemical reaction knowledge.",
        "Different reactants are separated by \".\". Your reply should contain only the SMILES representation of "
        "the predicted reactants and no other text." + _VALID,
        "Product SMILES", "Reactants SMILES"),
    IclTemplate(
        f"{_CHEMIST}Given the SMILES representation of a molecule, your task is to describe the molecule in "
        "natural language using your chemical knowledge.",
        "Your reply should describe the molecule's structure, class, properties and roles in a few sentences of "
        "plain text, on one line.",
        "Molecule SMILES", "Molecule description"),
    IclTemplate(
        f"{_CHEMIST}Given a description of a molecule, your task is to generate a molecule that fits the "
        "description using your chemical knowledge.",
        "Your reply should contain only the SMILES representation of the molecule and no other text." + _VALID,
        "Molecule description", "Molecule SMILES"),
    IclTemplate(
        f"{_CHEMIST}Given the IUPAC name of a molecule, your task is to give its molecular formula using your "
        "chemical knowledge.",
        "Your reply should contain only the molecular formula (for example C6H12O6) and no other text.",
        "IUPAC name", "Molecular formula"),
    IclTemplate(
        f"{_CHEMIST}Given the IUPAC name of a molecule, your task is to give its SMILES representation using your "
        "chemical knowledge.",
        "Your reply should contain only the SMILES representation of the molecule and no other text." + _VALID,
        "IUPAC name", "Molecule SMILES"),
    IclTemplate(
        f"{_CHEMIST}Given the SMILES representation of a molecule, your task is to give its molecular formula "
        "using your chemical knowledge.",
        "Your reply should contain only the molecular formula (for example C6H12O6) and no other text.",
        "Molecule SMILES", "Molecular formula"),
    IclTemplate(
        f"{_CHEMIST}Given the SMILES representation of a molecule, your task is to give its IUPAC name using your "
        "chemical knowledge.",
        "Your reply should contain only the IUPAC name of the molecule and no other text.",
        "Molecule SMILES", "IUPAC name"),
    IclTemplate(_props("predict its aqueous solubility (ESOL, log mol/L)"), _NUMBER,
                "Molecule SMILES", "Solubility (log mol/L)"),
    IclTemplate(_props("predict its octanol/water distribution coefficient (logD at pH 7.4)"), _NUMBER,
                "Molecule SMILES", "LogD"),
    IclTemplate(_props("predict whether it can penetrate the blood-brain barrier"), _YES_NO,
                "Molecule SMILES", "Penetrates the blood-brain barrier"),
    IclTemplate(_props("predict whether it is toxic to the human body (fails clinical trials for toxicity)"),
                _YES_NO, "Molecule SMILES", "Clinically toxic"),
    IclTemplate(_props("predict whether it inhibits HIV replication"), _YES_NO,
                "Molecule SMILES", "Inhibits HIV replication"),
    IclTemplate(_props("predict whether it causes the side effect named with each molecule"), _YES_NO,
                "Molecule SMILES", "Causes {target}"),
)))

GALACTICA: dict[str, str] = dict(zip(TASK_NAMES, (
    "Here are the reactants and reagents of a chemical reaction: [START_I_SMILES]{input}[END_I_SMILES]\n\n"
    "Question: What is the product of this reaction?\n\nAnswer: [START_I_SMILES]",
    "Here is the product of a chemical reaction: [START_I_SMILES]{input}[END_I_SMILES]\n\n"
    "Question: What are the reactants of this reaction?\n\nAnswer: [START_I_SMILES]",
    "[START_I_SMILES]{input}[END_I_SMILES]\n\nDescription:",
    "{input}\n\nThe SMILES formula of this molecule is [START_I_SMILES]",
    "## {input}\n\n### Molecular Formula\n\n",
    "## {input}\n\n### Canonical SMILES\n\n[START_SMILES]",
    "[START_I_SMILES]{input}[END_I_SMILES]\n\n## Chemical and Physical Properties\n\n### Molecular Formula\n\n",
    "[START_I_SMILES]{input}[END_I_SMILES]\n\n## Chemical and Physical Properties\n\n"
    "The following are chemical properties for",
    *(f"Here is a SMILES formula:\n\n[START_I_SMILES]{{input}}[END_I_SMILES]\n\nQuestion: {q}\n\nAnswer:" for q in (
        "What is the aqueous solubility (log mol/L) of this molecule?",
        "What is the octanol/water distribution coefficient (logD at pH 7.4) of this molecule?",
        "Will the chemical compound penetrate the blood-brain barrier?",
        "Is the chemical compound toxic to the human body?",
        "Can the chemical compound inhibit HIV replication?",
        "Can the chemical compound cause {target}?",
    )),
)))

# The first four are Mol-Instructions' own (its README's FS, RS, MC and MG instructions).
MOLINST: dict[str, str] = dict(zip(TASK_NAMES, (
    "With the provided reactants and reagents, propose a potential product.",
    "Please suggest potential reactants used in the synthesis of the provided product.",
    "Please give me some details about this molecule.",
    "Create a molecule with the structure as the one described.",
    "Please provide the molecular formula of the molecule with this IUPAC name.",
    "Please provide the SMILES representation of the molecule with this IUPAC name.",
    "Please provide the molecular formula of this molecule.",
    "Please provide the IUPAC name of this molecule.",
    "Please provide the aqueous solubility (log mol/L) of this molecule.",
    "Please provide the octanol/water distribution coefficient (logD at pH 7.4) of this molecule.",
    "Can this molecule penetrate the blood-brain barrier? Answer yes or no.",
    "Is this molecule toxic to the human body? Answer yes or no.",
    "Can this molecule inhibit HIV replication? Answer yes or no.",
    "Can this molecule cause {target}? Answer yes or no.",
)))

# The rows the paper prints (Figure 3); all others are approximations in the same structure.
PRINTED = {("icl", "forward_synthesis")}


@dataclass(frozen=True)
class Example:
    """A sample's core input and output (no tags, no query text) and its target (SIDER's side effect)."""
    input: str
    output: str = ""
    target: Optional[str] = None


def _fill(text: str, example: Example) -> str:
    # str.replace, not str.format: descriptions and names may hold braces
    return text.replace("{input}", example.input).replace("{target}", example.target or "")


def icl_query(task: str, question: Example, examples: Sequence[Example] = ()) -> str:
    """Figure 3's query: general and task-specific templates, the examples, the question with its output empty."""
    t = ICL[task]

    def lines(e: Example, output: str) -> str:
        return f"{t.input_title}: {e.input}\n{_fill(t.output_title, e)}:{output}"

    shots = "".join(lines(e, f" {e.output}") + "\n" for e in examples)
    return f"{t.general}\n{t.specific}\n\n{shots}{lines(question, '')}"


def galactica_query(task: str, question: Example) -> str:
    return _fill(GALACTICA[task], question)


def molinst_query(task: str, question: Example) -> str:
    """Mol-Instructions' Alpaca prompt with an input section, up to its ``### Response:`` line."""
    body = f"{_fill(MOLINST[task], question)}\n\n### Input:\n{question.input}"
    return PROMPT_TEMPLATES["alpaca"].replace("{input}", body)
