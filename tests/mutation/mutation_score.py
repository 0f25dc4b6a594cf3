"""How many plausible one-line bugs the fast tests catch: a mutation run over the whole package.

    python tests/mutation/mutation_score.py --seed 1 --sample 150   # a recorded run (bench/results/mutation.md)
    python tests/mutation/mutation_score.py --sample 20 --out /tmp/m # a quick look
    python tests/mutation/mutation_score.py --list                   # every mutant, without running anything
    python tests/mutation/mutation_score.py --ids <id> ...           # some again (the survivors, once tests are added)
    python tests/mutation/mutation_score.py --ids <id> ... --tests tests/test_x.py   # ... against the tests named
    python tests/mutation/mutation_score.py --report-only            # mutation.md again from mutation.json
    python tests/mutation/mutation_score.py --since <commit> --sample 80 --jobs 2 --map /tmp/map --out /tmp/new
                                               # the newest code's lines only, two mutants at a time, the map kept
    python tests/mutation/mutation_score.py --seed 2 --exclude <earlier runs' mutation.json> ...
                                               # a held-out sample: none of the mutants whose survivors were read

Each mutant changes one operator, constant, condition or return value (see `OPERATORS`) in one module of
`llasmol/`, in a copy of the checkout (the checkout itself is never touched), and runs the fast tests
(`-m "not slow"`) that execute the mutated line, fastest first, stopping at the first failure. Which tests
execute which line comes from one coverage run of the fast suite in that copy, each test under its own
coverage context, in the pytest process and in the Python subprocesses it starts
(tests/mutation/mutation_map_plugin.py); a line run only while a module is imported (a module constant, a
decorator) maps to every test that ran any of that module. A mutant is *killed* when a test fails (or the
run passes its time limit, five times the tests' own time plus a minute), *survived* otherwise; a mutant of
a line that no fast test executes survives without running. Mutants are drawn at random (seeded) from all
those of the package and run in the drawn order, and the results file is rewritten after each one, so a run
stopped early is still a random sample; the score's 95% interval is given. Survivors judged equivalent (no
behaviour a user could see changes) are listed in `EQUIVALENT` with the reason, and the score counts
non-equivalent mutants only.

A mutant is written into its module as a change of the mutated node's own text, so comments and the rest of
the file stay as they are (tests read some of them), and it is checked to parse to the mutated syntax tree.

The recorded runs are summarised in bench/results/mutation.md, one row each (their full result files were
not kept). The first (`--seed 0`) covered only the scoring, data and file-writing modules, with a hand-made map
of test files. The whole-package runs: `--seed 1`, then `--seed 2`, `--seed 5` and `--seed 6` (after the tests
written module by module in session 10), each drawn with the mutants of every earlier run left out, and a sample
of the newest code's lines (`--since 3f15bf1 --seed 4`). A run writes mutation.json and mutation.md to `--out`
(by default a folder under the system's temporary directory, outside the checkout).
The map kept by `--map` is brought up to date by measuring only the test files changed since it was made
(a change in the package itself measures everything again). Run outside CI: it is slow (the map 10-18
minutes, then some 30 s per mutant on 2 cores).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import functools
import hashlib
import json
import math
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/mutation/ -> the checkout
PLUGIN_DIR = Path(__file__).resolve().parent.relative_to(ROOT)  # this script's folder: its pytest plugin too

# Survivors that change nothing a user could observe, by mutant id, with the reason (filled in after
# reading each survivor of a recorded run).
EQUIVALENT: dict[str, str] = {
    "llasmol/finetune/lightning_private.py:92:70:constant:1":
        "the _ResultMetric made only to ask whether the installed Lightning still has `has_reset`: whether it "
        "holds a tensor or not, the attribute is there or not alike",
    "llasmol/metrics/families.py:257:21:constant:1":
        "where RMSE's two sums part (errors up to 2^256 or 2^257): both keep every square finite and the root "
        "is the same to rounding; no input between the two bounds is a plausible property error",
    "llasmol/metrics/families.py:94:31:constant:1":
        "has_top{k} is only read as `> 0` (was a top-k answer list ever that long); 2.0 reads the same",
    "llasmol/metrics/formula.py:49:16:compare:1":
        "flips the sign of every charge alike; a formula's charge is only ever compared with another "
        "formula's, parsed the same way, so no comparison changes",
    **{f"llasmol/metrics/text.py:63:{col}:constant:1":
       "the ASCII punctuation ranges hold only Unicode P or S characters, which the next line accepts anyway "
       "(127 is a control character, dropped before the check)"
       for col in (27, 67, 82)},
    "llasmol/metrics/text.py:90:11:compare:1":
        "stopping at MAX_TOKENS or one token later: the result is cut to MAX_TOKENS either way",
    "llasmol/metrics/text.py:188:60:constant:1":
        "rmtree of a stale folder that exists: there is no error to ignore",
    "llasmol/metrics/text.py:203:4:statement:1":
        "NLTK's lazy WordNet loads on its first use anyway; loading it up front only moves the cost",
    "llasmol/metrics/text.py:266:7:compare:1":
        "an empty hypothesis has no matched n-gram: the loop below returns 0.0 for it as the guard does",
    "llasmol/metrics/text.py:271:27:compare:1":
        "`total` is max(1, ...) in bleu_stats, so a sum of them is never 0: `<= 0` and `< 0` agree",
    "llasmol/metrics/text.py:218:29:constant:1":
        "the ROUGE scorer's cache size: 0 builds a new scorer per call, the same scores",
    "llasmol/core/files.py:24:21:constant:1":
        "the value os.umask sets for an instant is never used: the call only reads the old umask, restored next",
    "llasmol/core/files.py:99:16:statement:1":
        "os.walk then tries to list the folder just removed, fails, and skips it (walk ignores such errors)",
    "llasmol/metrics/molecules.py:114:58:constant:1":
        "fingerprints computed without being asked: the same keys and validity, more time",
    # The whole-package run (--seed 1, on the tree of 0e2e034).
    "llasmol/leakage/sample_keys.py:53:29:constant:1":
        "the audit's molecule cache size: 0 keeps no cache, the same keys computed again (more time)",
    "llasmol/inference/beam_search.py:69:61:constant:1":
        "longest prompts first or last: either order gives a stopped evaluation the same later batches, and "
        "the answers do not depend on which prompts share a batch (BENCHMARKS section 2: identical at batch 1 "
        "and 8); longest first only makes an out-of-memory batch come first",
    "llasmol/finetune/checkpointing.py:80:48:constant:1":
        "rmtree of the staged adapter folder, which exists: there is no error to ignore",
    "llasmol/classical/runner.py:102:74:constant:1":
        "run_baseline's named_tasks default: its one caller (the baseline command) always passes it",
    "llasmol/finetune/lightning_private.py:81:81:constant:1":
        "a flag of the throwaway Trainer built only to ask whether a private attribute exists; it has the "
        "attribute either way",
    "llasmol/metrics/text.py:208:4:statement:1":
        "NLTK's lazy WordNet loads on its first use anyway; loading it up front only moves the cost (as the "
        "first run's text.py:203)",
    "llasmol/analysis/trivial.py:51:62:constant:1":
        "marks the constant answers skipped: that adds only to num_skipped, and the trivial table shows the "
        "headline metric alone",
    "llasmol/leakage/checks.py:109:15:condition:1":
        "which files go through the worker pool: the pool computes the same keys "
        "(tests/test_audit.py::test_worker_processes_find_the_same), only the time differs",
    "llasmol/data/smolinstruct.py:443:36:constant:1":
        "j - n_k instead of j (n_k the task's sample count) is j's negative alias: the numpy arrays and the "
        "list indexed with it give the same element",
    "llasmol/data/smolinstruct.py:113:12:return:1":
        "None for False at the end of the file: every caller reads the result as true or false",
    "llasmol/metrics/molecules.py:137:8:condition:1":
        "the official rebuild applied to a molecule without isotopes, radicals or stated hydrogens gives it "
        "back unchanged (the 551 molecules of tests/data agree with the official form either way); the check "
        "only saves its time",
    "llasmol/inference/pipeline.py:147:18:constant:1":
        "RunFiles not frozen: nothing assigns to its fields",
    "llasmol/leakage/sample_keys.py:140:31:binop:1":
        "how many chunks wait in the worker pool before the oldest is taken: the same keys in the same order, "
        "only less overlap",
    "llasmol/metrics/text.py:68:27:compare:1":
        "':' (58) is Unicode punctuation, which the next line accepts anyway (as the first run's text.py:63)",
    # The held-out run (--seed 2, on the tree of 96ce6d2).
    "llasmol/inference/partial.py:65:8:statement:1":
        "answered() closes the partial file before reading it back: every append was flushed and fsynced, so "
        "the count read is the same; the handle stays open only until the stopped command exits",
    "llasmol/leakage/sample_keys.py:137:11:compare:1":
        "how many records go to an audit worker at once (each record alone instead of 500): the same keys in "
        "the same order (tests/test_audit.py::test_worker_processes_find_the_same), only slower",
    "llasmol/inference/progress.py:62:50:constant:1":
        "the progress ticker as a daemon thread or not: leaving the context always stops and joins it",
    "llasmol/leakage/checks.py:255:45:constant:1":
        "cancel_futures when the audit's pool shuts down: after a clean scan nothing is queued; after an error "
        "the queued chunks finish before the error shows (time only)",
    "llasmol/leakage/checks.py:152:27:compare:1":
        "a shared reaction whose reactants equal the other sample's exactly: a field's key is a function of its "
        "parts, so equal parts mean equal keys and the lookup of the line above finds the same pair "
        "(tests/test_audit.py, both directions)",
    # The second held-out run (--seed 5, on the tree of cd021ff).
    "llasmol/metrics/text.py:193:60:constant:1":
        "rmtree of a stale WordNet folder that exists (the rename just failed on it): there is no error to ignore",
    "llasmol/train.py:47:40:constant:1":
        "seed_everything(workers=...) seeds each DataLoader worker's RNGs: nothing random runs in a worker "
        "(the sampler shuffles with its own seeded generator in the main process; data.num_workers is 0 by default)",
}

# Recorded ids whose module moved since the recorded run (lines added above them): id then -> id now, for
# running those survivors again.
MOVED: dict[str, str] = {
    "llasmol/metrics/extract.py:61:8:condition:1": "llasmol/metrics/extract.py:68:8:condition:1",
    # The whole-package run's survivors in modules changed since (the same text elsewhere in the module too).
    "llasmol/core/schema.py:277:37:constant:1": "llasmol/core/schema.py:281:37:constant:1",
    "llasmol/core/schema.py:516:43:compare:1": "llasmol/core/schema.py:523:43:compare:1",
    "llasmol/core/config.py:214:60:constant:1": "llasmol/core/config.py:327:60:constant:1",
}

# Survivors still not killed that are not equivalent either, with why no test kills them.
NOT_KILLED: dict[str, str] = {
    "llasmol/data/sampler.py:66:81:constant:1":
        "the index dtype switches to int64 at 3**31 instead of 2**31 samples: wrong only for splits of over "
        "2.1 billion samples (SMolInstruct has 3.3 million); a test would need an 8 GiB index",
    # The whole-package run (--seed 1).
    "llasmol/finetune/resume.py:186:27:binop:1":
        "the W&B id file is written only by runs with a W&B logger, which start W&B (seconds): the slow "
        "W&B resume tests (tests/test_tracking.py) fail on it, no fast test does",
    # The held-out run (--seed 2).
    "llasmol/finetune/lightning_private.py:116:8:statement:1":
        "interrupted.ckpt is written only when Ctrl-C or SIGTERM stops a real fit at a step boundary: the slow "
        "resume tests (tests/test_resume.py) stop fits and fail on it; no fast test stops a fit",
    "llasmol/finetune/checkpointing.py:110:12:statement:1":
        "as lightning_private.py:116: interrupted.ckpt, written only when a signal stops a real fit (slow tests)",
    "llasmol/inference/loading.py:244:12:statement:1":
        "a log line for an adapter kept apart from a quantised base: no fast test loads a quantised base with "
        "an adapter, and none reads the line",
    "llasmol/analysis/plots.py:252:11:compare:1":
        "the legend under a molecule pair of the worst-examples grid is drawn into the PNG; no test reads the "
        "picture's text",
    # The second held-out run (--seed 5): read, no test written yet; why no fast test fails.
    "llasmol/finetune/checkpointing.py:88:12:statement:1":
        "a replaced best checkpoint's adapter folder stays: no fast run validates twice with a better second loss",
    "llasmol/finetune/lightning_private.py:112:8:statement:1":
        "as checkpointing.py:88: the hook that removes a replaced checkpoint's adapter",
    "llasmol/analysis/plots.py:251:23:condition:1":
        "as plots.py:252 (seed 2): the text under a molecule pair, drawn into the PNG only",
    "llasmol/analysis/plots.py:206:66:constant:1": "the size of the error bars' caps, a drawing detail",
    "llasmol/analysis/plots.py:145:8:statement:1":
        "the 'no validation' note on an empty trends chart: no test draws a run without any validation",
    "llasmol/finetune/module.py:120:63:constant:1":
        "the example key in the one-line error of a checkpoint of another LoRA variant: only the slow resume "
        "test resumes another variant",
    "llasmol/finetune/checkpointing.py:106:71:constant:1":
        "an exception without the step-boundary mark would save interrupted.ckpt: only a signal stopping a real "
        "fit gets there (slow tests)",
    "llasmol/finetune/fit.py:49:4:statement:1":
        "the log line of the last step's extra validation: the fast runs end on a validation step",
    "llasmol/core/config.py:272:4:return:1":
        "the first line of a Hydra error of no known kind: every fast test's mistake is of a known kind",
    "llasmol/baseline.py:57:8:statement:1":
        "baseline's check that output= is no FIFO or device: no fast baseline test writes to output=",
    "llasmol/data/sampler.py:68:84:constant:1":
        "int32 indices up to 2^32 samples instead of 2^31: wrong only for splits of over 2.1 billion samples; a "
        "test would need an 8 GiB index",
    "llasmol/data/sampler.py:44:28:constant:1":
        "the length-grouping window (64 micro-batches): no test pins the batches of data.group_by_length",
    "llasmol/finetune/build.py:116:51:constant:1":
        "the hyperparameters logged unresolved (${...}): no fast test reads hparams.yaml or W&B's config",
    "llasmol/leakage/checks.py:177:8:condition:1":
        "the audit's worker pool, started only for files over 4 MiB: the fast worker test's files are smaller",
    "llasmol/classical/morgan.py:78:24:constant:1":
        "the nearest-neighbour search's empty start: the first table chunk replaces it; no test looks for a "
        "neighbour index the first chunk cannot give",
    "llasmol/finetune/validation.py:86:11:boolop:1":
        "the guard of the best-val/loss log line: only a sanity check, another rank or a validation without a "
        "loss reaches the other branches, none in the fast suite",
    # The newest-code sample (--since 3f15bf1 --seed 4).
    "llasmol/generate.py:54:4:statement:1":
        "generate's known-noise filters: warning filters are process-wide, so in the test process an earlier "
        "command has set them already; the noise they hide (a transformers deprecation on PEFT models) shows "
        "only in a fresh process generating with an adapter (the slow CLI test, which does not read stderr for it)",
}

_SWAP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_SWAP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
               ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
OPERATORS = ("compare", "binop", "boolop", "not", "constant", "return", "condition", "statement")


@dataclass
class Mutant:
    id: str  # module:line:col:operator:n, stable while the module's text is
    module: str
    line: int
    operator: str
    before: str
    after: str
    status: str = "not run"
    seconds: float = 0.0
    killed_by: str = ""  # the first test that failed


def _is_docstring(node: ast.AST, parents: dict) -> bool:
    parent = parents.get(node)
    return isinstance(parent, ast.Expr) and isinstance(parents.get(parent), (ast.Module, ast.FunctionDef,
                                                                              ast.ClassDef, ast.AsyncFunctionDef))


def _skipped(node: ast.AST, parents: dict) -> bool:
    """Nodes whose mutation only changes a message or a type hint: inside raise, log calls, annotations,
    f-strings."""
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.Raise) or isinstance(parent, ast.JoinedStr):
            return True
        if isinstance(parent, (ast.arg, ast.AnnAssign)) and node is getattr(parent, "annotation", None):
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is parent.returns:
            return True
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr in (
                "debug", "info", "warning", "error", "exception"):
            return True
        node = parent
    return False


def _edits(tree: ast.Module):
    """(node, operator name, a function that mutates a deep copy's matching node) for every mutation."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if _skipped(node, parents):
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _SWAP_COMPARE:
                    yield node, "compare", lambda n, i=i: n.ops.__setitem__(i, _SWAP_COMPARE[type(n.ops[i])]())
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _SWAP_BINOP:
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
                continue  # "%s" % x formatting
            yield node, "binop", lambda n: setattr(n, "op", _SWAP_BINOP[type(n.op)]())
        elif isinstance(node, ast.BoolOp):
            yield node, "boolop", lambda n: setattr(n, "op", ast.Or() if isinstance(n.op, ast.And) else ast.And())
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "not", None  # replaced by its operand (below)
        elif isinstance(node, ast.Constant) and not _is_docstring(node, parents):
            if isinstance(node.value, bool):
                yield node, "constant", lambda n: setattr(n, "value", not n.value)
            elif isinstance(node.value, int):
                yield node, "constant", lambda n: setattr(n, "value", n.value + 1 if n.value != 1 else 0)
            elif isinstance(node.value, float):
                yield node, "constant", lambda n: setattr(n, "value", n.value * 2 if n.value else 1.0)
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            yield node, "return", lambda n: setattr(n, "value", ast.Constant(None))
        elif isinstance(node, (ast.If, ast.While)) or isinstance(node, ast.IfExp):
            yield node, "condition", lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not _skipped(node.value, parents):
            yield node, "statement", None  # replaced by `pass` (below)


def _replace(tree: ast.Module, target_index: int, operator: str, mutate) -> ast.Module:
    """A copy of `tree` with the `target_index`-th node of ast.walk mutated."""
    new = copy.deepcopy(tree)
    nodes = list(ast.walk(new))
    target = nodes[target_index]
    if operator in ("not", "statement"):
        parents = {child: node for node in ast.walk(new) for child in ast.iter_child_nodes(node)}
        parent = parents[target]
        substitute = target.operand if operator == "not" else ast.Pass()
        for field, value in ast.iter_fields(parent):
            if value is target:
                setattr(parent, field, substitute)
            elif isinstance(value, list) and any(v is target for v in value):
                setattr(parent, field, [substitute if v is target else v for v in value])
    else:
        mutate(target)
    return ast.fix_missing_locations(new)


def package_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "llasmol").rglob("*.py"))


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset


def _byte_range(source: str, span: tuple[int, int, int, int]) -> tuple[int, int]:
    """Where `span` (ast line numbers, UTF-8 byte columns) lies in `source`'s UTF-8 bytes."""
    lines = source.encode().splitlines(keepends=True)
    l1, c1, l2, c2 = span
    return sum(len(x) for x in lines[: l1 - 1]) + c1, sum(len(x) for x in lines[: l2 - 1]) + c2


def _splice(source: str, span: tuple[int, int, int, int], text: str) -> str:
    """`source` with the text at `span` replaced by `text`."""
    start, end = _byte_range(source, span)
    raw = source.encode()
    return (raw[:start] + text.encode() + raw[end:]).decode()


def _segment(source: str, node: ast.AST) -> str:
    start, end = _byte_range(source, _span(node))
    return source.encode()[start:end].decode()


def _text_edit(source: str, node: ast.AST, operator: str, mutate) -> tuple[tuple[int, int, int, int], str]:
    """The span to replace and its new text, for one mutation of `node`."""
    if operator == "statement":
        return _span(node), "pass"
    if operator == "not":
        return _span(node), f"({_segment(source, node.operand)})"
    if operator == "return":
        return _span(node.value), "None"
    if operator == "condition":
        return _span(node.test), f"not ({_segment(source, node.test)})"
    changed = copy.deepcopy(node)
    mutate(changed)
    if operator == "constant":
        return _span(node), repr(changed.value)
    if isinstance(node, ast.AugAssign):
        return _span(node), ast.unparse(changed)
    return _span(node), f"({ast.unparse(changed)})"


def _same_tree(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a, include_attributes=False) == ast.dump(b, include_attributes=False)


def _lines_of(node: ast.AST, operator: str, parents: dict) -> range:
    """The source lines whose execution the mutated node's behaviour rides on: the condition's own lines for
    a condition, the statement holding an expression from its first line."""
    if operator == "condition":
        return range(node.test.lineno, node.test.end_lineno + 1)
    start = node
    while not isinstance(start, ast.stmt) and start in parents:
        start = parents[start]
    # A decorator sits above its def's own line.
    return range(min(start.lineno, node.lineno), max(start.lineno, node.end_lineno) + 1)


@dataclass
class Candidate:
    """A mutant before its source is written: where it is and what it does."""
    mutant: "Mutant"
    edit: int  # its position in the module's list of edits (`_edits`)
    lines: range


def candidates(module: str) -> list[Candidate]:
    """Every mutant of `module` (cheap: nothing is copied or written yet)."""
    source = (ROOT / module).read_text()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out, seen = [], {}
    for edit, (node, operator, mutate) in enumerate(list(_edits(tree))):
        key = f"{module}:{node.lineno}:{node.col_offset}:{operator}"
        seen[key] = seen.get(key, 0) + 1
        before = ast.get_source_segment(source, node) or ast.unparse(node)
        _, text = _text_edit(source, node, operator, mutate)
        after = {"statement": "pass", "not": ast.unparse(getattr(node, "operand", node)),
                 "condition": f"not ({ast.unparse(getattr(node, 'test', node))})"}.get(operator, text)
        if operator in ("condition",):
            before = ast.unparse(node.test)
        out.append(Candidate(Mutant(f"{key}:{seen[key]}", module, node.lineno, operator,
                                    before.splitlines()[0][:100], after.splitlines()[0][:100]),
                             edit, _lines_of(node, operator, parents)))
    return out


def mutated_source(candidate: Candidate, root: Path) -> str:
    """The module's text in the copy at `root` (the checkout as it was when the run began: it may have changed
    since) with this one mutation, checked to parse to the mutated tree."""
    source = (root / candidate.mutant.module).read_text()
    tree = ast.parse(source)
    node, operator, op_fn = list(_edits(tree))[candidate.edit]
    index = next(i for i, n in enumerate(ast.walk(tree)) if n is node)
    span, text = _text_edit(source, node, operator, op_fn)
    new_source = _splice(source, span, text)
    expected = _replace(tree, index, operator, op_fn)
    if not _same_tree(ast.parse(new_source), expected):
        raise RuntimeError(f"{candidate.mutant.id}: the text edit does not give the mutated tree")
    return new_source


# ---------------------------------------------------------------------------------------------- the map


def _copy_checkout(dest: Path) -> None:
    """The tracked files of the checkout (plus this script's untracked neighbours), as they are now."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _env(copy_root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{copy_root}{os.pathsep}{copy_root / PLUGIN_DIR}", "HF_HUB_OFFLINE": "1",
            "PYTHONDONTWRITEBYTECODE": "1"}


def tree_files(root: Path) -> dict[str, str]:
    """What a coverage map depends on, file by file (a digest each): the package's modules (their line
    numbers) and the tests' files (their test ids, and what they run); not this tooling's own folder."""
    found = [*(root / "llasmol").rglob("*.py"), *(root / "tests").rglob("*")]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(found)
            if p.is_file() and "__pycache__" not in p.parts and not p.relative_to(root).is_relative_to(PLUGIN_DIR)}


def _measure(copy_root: Path, tests: list[str]) -> dict:
    """Run `tests` (all fast tests when empty) under coverage in `copy_root`, each test in its own context:
    the lines each test executes, each test's duration, and the tests that fail unmutated."""
    start = time.time()
    for old in copy_root.glob(".coverage*"):
        old.unlink()
    rc = copy_root / ".mutation-coveragerc"
    rc.write_text("[run]\nsource = llasmol\npatch = subprocess\nparallel = true\n"
                  f"data_file = {copy_root / '.coverage'}\n")
    env = {**_env(copy_root), "MUTATION_MAP_DURATIONS": str(copy_root / ".durations.json")}
    with open(copy_root / ".pytest-log.txt", "w") as log:
        subprocess.run([sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", "-q", "-rf",
                        "-p", "no:cacheprovider", "-p", "mutation_map_plugin", "-m", "not slow", *tests],
                       cwd=copy_root, env=env, stdout=log, stderr=subprocess.STDOUT)
    subprocess.run([sys.executable, "-m", "coverage", "combine", f"--rcfile={rc}", "-q"], cwd=copy_root, env=env,
                   check=True)
    import coverage  # the mutation run's own requirement (the dev extra), not the package's

    data = coverage.CoverageData(basename=str(copy_root / ".coverage"))
    data.read()
    lines: dict[str, dict[str, list[str]]] = {}
    for measured in data.measured_files():
        if "/llasmol/" in measured:  # the copy's path, wherever the copy was
            module = measured[measured.rindex("/llasmol/") + 1:]
            lines[module] = {str(n): sorted(c) for n, c in data.contexts_by_lineno(measured).items()}
    log_lines = (copy_root / ".pytest-log.txt").read_text().splitlines()
    return {"seconds": time.time() - start, "durations": json.loads((copy_root / ".durations.json").read_text()),
            "failed": sorted({line.split()[1] for line in log_lines if line.startswith("FAILED ")}), "lines": lines}


def build_map(copy_root: Path, saved: Path | None = None) -> dict:
    """Which fast tests execute each line of the package, how long each test takes, and which fail unmutated
    (those never judge a mutant): one coverage run of the fast suite in `copy_root`. `saved`: a folder that
    keeps the map (map.json, with the digests of the files it was made from). Where it holds one of this same
    tree it is read; where only test files were added, changed or removed since, just those are measured again
    and the map is brought up to date; a change in the package or in the tests' shared files measures all."""
    now = tree_files(copy_root)
    old = json.loads((saved / "map.json").read_text()) if saved is not None and (saved / "map.json").is_file() \
        else None
    changed = sorted(f for f in set(now) | set(old["files"]) if now.get(f) != old["files"].get(f)) if old else None
    if old is not None and not changed:
        cov = old
    elif old is not None and all(Path(f).name.startswith("test_") and f.count("/") == 1 for f in changed):
        files = [f for f in changed if f in now]
        print(f"coverage map: {len(changed)} test files changed since it was made; measuring {files}", flush=True)
        part = _measure(copy_root, files) if files else {"seconds": 0.0, "durations": {}, "failed": [], "lines": {}}
        mine = set(changed)
        keep = [c for c in old["durations"] if c.split("::")[0] not in mine]
        cov = {"seconds": old["seconds"], "extended": old.get("extended", 0) + part["seconds"],
               "durations": {**{c: old["durations"][c] for c in keep}, **part["durations"]},
               "failed": sorted({c for c in old["failed"] if c.split("::")[0] not in mine} | set(part["failed"])),
               "lines": {}}
        for module in set(old["lines"]) | set(part["lines"]):
            merged = {n: [c for c in cs if c.split("::")[0] not in mine]
                      for n, cs in old["lines"].get(module, {}).items()}
            for n, cs in part["lines"].get(module, {}).items():
                merged[n] = sorted(set(merged.get(n, [])) | set(cs))
            cov["lines"][module] = merged
    else:
        if old is not None:
            print(f"coverage map: made anew ({len(changed)} files changed, not only tests: {changed[:5]})", flush=True)
        cov = _measure(copy_root, [])
    cov["files"] = now
    if saved is not None and cov is not old:
        saved.mkdir(parents=True, exist_ok=True)
        _write_json(saved / "map.json", cov)
    return {**cov, "lines": {m: {int(n): cs for n, cs in by.items()} for m, by in cov["lines"].items()}}


@functools.lru_cache(maxsize=None)  # asked once per mutant of a module's import-time lines
def _importers(module: str, root: Path) -> frozenset[str]:
    """The test files (and their helpers' users) that import `module` by name."""
    name = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    parent, _, leaf = name.rpartition(".")
    found = set()
    for path in (root / "tests").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        if f"import {name}" in text or f"from {name} import" in text or f"from {parent} import {leaf}" in text:
            found.add(f"tests/{path.name}")
    return frozenset(found)


def tests_for(candidate: Candidate, cov: dict, root: Path) -> list[str]:
    """The fast tests that execute the mutated lines, fastest first; for a line run at import time, also
    every test that ran any line of the module (the import may have happened in another test)."""
    if cov["lines"] is None:  # --tests: the tests named
        return list(cov["tests"])
    by_line = cov["lines"].get(candidate.mutant.module, {})
    tests: set[str] = set()
    import_time = False
    for n in candidate.lines:
        contexts = by_line.get(n, [])
        import_time |= "" in contexts
        tests.update(c for c in contexts if c)
    if import_time:  # a line run as the module loads (a constant, a table) is read by whoever uses the module:
        # the tests that ran any of its lines, and those of the test files that import it (a test that only
        # reads a table the module built at import runs none of its lines)
        tests |= {c for contexts in by_line.values() for c in contexts if c}
        files = _importers(candidate.mutant.module, root)
        tests |= {t for t in cov["durations"] if t.split("::")[0] in files}
    tests -= set(cov["failed"])
    return sorted(tests, key=lambda t: (cov["durations"].get(t, 0.0), t))


def _run_tests(copy_root: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p",
                               "no:randomly", "-m", "not slow", *tests], cwd=copy_root, env=_env(copy_root),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.time() - start, ""
    status = "survived" if proc.returncode == 0 else "killed"
    if proc.returncode not in (0, 1):
        status = f"killed (pytest exit {proc.returncode})"
    failed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return status, time.time() - start, failed[0] if failed else ""



def _interval(killed: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    z, p = 1.96, killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _folder(module: str) -> str:
    parts = module.split("/")
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else module


def _report(recorded: dict, rerun: dict[str, dict] | None = None) -> str:
    """The score table and every survivor with its verdict. `rerun`: survivors run again after tests were
    added for them (`--ids`, results in rerun/), by id; both scores are shown."""
    results = [Mutant(**m) for m in recorded["mutants"]]
    first = [m for m in results if m.id not in EQUIVALENT]
    first_killed = sum(m.status.startswith("killed") for m in first)
    reselected_killed = sum(m.id in recorded.get("reselected", ()) and m.status.startswith("killed") for m in first)
    survivors = [m for m in results if not m.status.startswith("killed")]
    if rerun:
        again = {m.id: rerun.get(m.id) or rerun.get(MOVED.get(m.id, m.id)) for m in results}
        results = [Mutant(**{**asdict(m), "status": "killed (rerun)", "killed_by": again[m.id].get("killed_by", "")})
                   if again[m.id] and again[m.id]["status"].startswith("killed") else m for m in results]
    rows = []
    for folder in sorted({_folder(m.module) for m in results}):
        mine = [m for m in results if _folder(m.module) == folder]
        scored = [m for m in mine if m.id not in EQUIVALENT]
        killed = sum(m.status.startswith("killed") for m in scored)
        unrun = sum(m.status == "survived (no fast test runs it)" for m in mine)
        rows.append(f"| `{folder}` | {len(mine)} | {len(mine) - len(scored)} | {unrun} | {killed}/{len(scored)} |")
    scored = [m for m in results if m.id not in EQUIVALENT]
    killed = sum(m.status.startswith("killed") for m in scored)
    timeouts = sum(m.status == "killed (timeout)" for m in results)
    lo, hi = _interval(killed, len(scored))
    flo, fhi = _interval(first_killed, len(first))
    cov = recorded.get("map", {})
    lines = [
        "# Mutation score", "",
        f"`{recorded['command']}`" + (f" on the tree of commit {recorded['tree']}" if recorded.get("tree") else "")
        + f": {len(results)} of {recorded['total_mutants']} mutants of "
        f"{recorded.get('scope', 'the target modules')}, drawn at random and run in the drawn order; each run "
        "against the fast tests that execute its line.", "",
        *([f"The coverage map: the fast suite under coverage took {cov['seconds'] / 60:.1f} min; "
           f"{len(cov.get('failed', []))} tests failed unmutated and judge no mutant"
           + (f" ({', '.join(f'`{t}`' for t in cov['failed'])})" if cov.get("failed") else "") + ".", ""]
          if cov else []),
        f"**Score before any test was written for its survivors: {first_killed}/{len(first)} non-equivalent "
        f"mutants killed = {first_killed / max(1, len(first)):.1%}** (95% interval {flo:.1%}–{fhi:.1%}); "
        f"{len(results) - len(scored)} judged equivalent; {timeouts} killed by the time limit.", "",
        *([f"{len(recorded['reselected'])} survivors of the run were run again on the same tree, before any test "
           "was written, with the test selection corrected after they were seen (a line run as its module loads "
           "is also judged by the test files that import the module; a decorator by the tests that run its "
           "line); their results above are those: " + ", ".join(f"`{i}`" for i in recorded["reselected"]) + ". "
           f"With the run's own selection, {first_killed - reselected_killed}/{len(first)} were killed.",
           ""] if recorded.get("reselected") else []),
        *([f"Tests were then added for its survivors, and those survivors run again (`--ids`, rerun/): "
           f"{sum(r['status'].startswith('killed') for r in rerun.values())} of {len(rerun)} are killed now, "
           f"so **{killed}/{len(scored)} = {killed / max(1, len(scored)):.1%}** (95% interval {lo:.1%}–{hi:.1%}) "
           "with them.", ""] if rerun else []),
        "| folder | mutants run | equivalent | no fast test runs the line | killed |", "|---|---|---|---|---|",
        *rows, "",
        "## Survivors", "",
        "| mutant | change | verdict |", "|---|---|---|",
    ]
    now = {m.id: m for m in results}
    for m in survivors:  # every survivor of the recorded run, with what became of it
        m = now[m.id]
        if m.id in EQUIVALENT:
            verdict = f"equivalent: {EQUIVALENT[m.id]}"
        elif m.status.startswith("killed"):
            verdict = f"killed now by `{m.killed_by}`" if m.killed_by else "killed now"
        else:
            verdict = "**not killed**" + (f": {NOT_KILLED[m.id]}" if m.id in NOT_KILLED else "")
        change = f"`{m.before}` → `{m.after}`".replace("|", "\\|")
        lines.append(f"| `{m.id}` | {change} | {verdict} |")
    return "\n".join(lines) + "\n"


def _tree_commit() -> str:
    """The commit the run's copy was taken from, and whether the package or tests differed from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "llasmol", "tests"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def _write_json(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)


def changed_lines(since: str) -> dict[str, set[int]]:
    """The package's lines added or changed since commit `since` (the working tree against it), by module."""
    diff = subprocess.run(["git", "diff", "-U0", "--no-color", since, "--", "llasmol/"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    out: dict[str, set[int]] = {}
    module = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            module = line[6:] if line.startswith("+++ b/") else None
        elif line.startswith("@@") and module:
            new = line.split()[2].lstrip("+")  # "+start,count" (count 1 when left out)
            start, _, count = new.partition(",")
            out.setdefault(module, set()).update(range(int(start), int(start) + int(count or 1)))
    return out


def _seen_keys(files: list[Path]) -> set:
    """Mutants of recorded runs, by id and by what they change (an id moves when lines are added above it)."""
    keys: set = set()
    for file in files:
        for m in json.loads(file.read_text())["mutants"]:
            keys |= {m["id"], (m["module"], m["operator"], m["before"], m["after"])}
    return keys


def _find_again(ids: list[str], everything: list[Candidate], recorded_file: Path) -> list[Candidate]:
    """The candidates of `ids`; an id whose module has changed since the recorded run is found by its
    module, operator and text (the same change in the same place, moved), and keeps its recorded id."""
    recorded = ({m["id"]: m for m in json.loads(recorded_file.read_text())["mutants"]}
                if recorded_file.is_file() else {})
    by_id = {c.mutant.id: c for c in everything}
    chosen = []
    for mutant_id in ids:
        found = by_id.get(MOVED.get(mutant_id, mutant_id))
        if found is not None and mutant_id in recorded and (found.mutant.operator, found.mutant.before,
                                                            found.mutant.after) != (
                recorded[mutant_id]["operator"], recorded[mutant_id]["before"], recorded[mutant_id]["after"]):
            found = None  # the id now names another change (lines moved): find the recorded one by its text
        if found is None and mutant_id in recorded:
            r = recorded[mutant_id]
            same = [c for c in everything if (c.mutant.module, c.mutant.operator, c.mutant.before, c.mutant.after)
                    == (r["module"], r["operator"], r["before"], r["after"])]
            # the same text in several places: the one nearest the recorded line (lines added above it move it)
            found = min(same, key=lambda c: (abs(c.mutant.line - r["line"]), c.mutant.line)) if same else None
        if found is None:
            print(f"not found (changed beyond recognition): {mutant_id}", file=sys.stderr)
            continue
        found.mutant.id = mutant_id
        chosen.append(found)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=150, help="mutants to run, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modules", default="llasmol/", help="only modules whose path starts with this")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--ids", nargs="+", help="run only these mutants (e.g. the survivors of a recorded run)")
    parser.add_argument("--tests", nargs="+", help="with --ids: run these tests (files or node ids) for each mutant "
                        "instead of those the coverage map finds (no map is built)")
    parser.add_argument("--reselect", action="store_true",
                        help="with --ids (and --map of the recorded run's tree): run survivors again with this "
                        "script's test selection, their results replacing the recorded ones (no test added)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite mutation.md from mutation.json (after judging survivors in EQUIVALENT)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "llasmol-mutation",
                        help="where mutation.json and mutation.md are written (bench/results/mutation.md keeps only "
                        "a summary of the recorded runs)")
    parser.add_argument("--since", help="only mutants of lines added or changed since this commit (the newest code)")
    parser.add_argument("--exclude", type=Path, nargs="+", default=[],
                        help="mutation.json files of earlier runs whose mutants are not drawn again (a held-out "
                        "sample: none whose survivors have been read)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy")
    parser.add_argument("--map", type=Path, help="a folder keeping the coverage map's files: read where it holds "
                        "them (a map of this same tree), else written there")
    args = parser.parse_args()

    if args.report_only:
        recorded = json.loads((args.out / "mutation.json").read_text())
        rerun_file = args.out / "rerun" / "mutation.json"
        rerun = ({m["id"]: m for m in json.loads(rerun_file.read_text())["mutants"]}
                 if rerun_file.is_file() else None)
        (args.out / "mutation.md").write_text(_report(recorded, rerun))
        print((args.out / "mutation.md").read_text())
        return
    modules = [m for m in package_modules() if m.startswith(args.modules)]
    everything = [c for module in modules for c in candidates(module)]
    if args.since:
        changed = changed_lines(args.since)
        everything = [c for c in everything if c.mutant.line in changed.get(c.mutant.module, ())]
    if args.exclude:
        seen = _seen_keys(args.exclude)
        everything = [c for c in everything if c.mutant.id not in seen and (
            c.mutant.module, c.mutant.operator, c.mutant.before, c.mutant.after) not in seen]
    if args.list:
        for c in everything:
            print(f"{c.mutant.id}\t{c.mutant.before}  ->  {c.mutant.after}")
        print(f"{len(everything)} mutants", file=sys.stderr)
        return
    if args.ids:
        chosen = _find_again(args.ids, everything, args.out / "mutation.json")
        if not args.reselect:
            args.out = args.out / "rerun"
        command = "python tests/mutation/mutation_score.py --ids " + " ".join(args.ids) + (
            " --tests " + " ".join(args.tests) if args.tests else "")
    else:
        chosen = random.Random(args.seed).sample(everything, min(args.sample, len(everything))) if args.sample \
            else everything
        command = f"python tests/mutation/mutation_score.py --sample {args.sample} --seed {args.seed}" + (
            f" --since {args.since}" if args.since else "") + "".join(
            f" --exclude {os.path.relpath(f, ROOT)}" for f in args.exclude)
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="llasmol-mutants-") as tmp:
        copy_root = Path(tmp)
        _copy_checkout(copy_root)
        if args.tests:  # the survivors again, against the tests written for them
            if not args.ids:
                parser.error("--tests goes with --ids")
            status, seconds, failed = _run_tests(copy_root, args.tests, 3600)
            if status != "survived":
                sys.exit(f"the unmutated package fails {failed or args.tests}: fix that first")
            cov = {"seconds": 0.0, "failed": [], "durations": {t: seconds / len(args.tests) for t in args.tests},
                   "lines": None, "tests": args.tests}
        else:
            print(f"coverage map: the fast suite under coverage in {copy_root} ...", flush=True)
            cov = build_map(copy_root, args.map)
            print(f"coverage map: {cov['seconds'] / 60:.1f} min, {len(cov['durations'])} tests, "
                  f"{len(cov['failed'])} failing unmutated: {cov['failed']}", flush=True)
        scope = f"`{args.modules}`" + (f", lines changed since {args.since}" if args.since else "") + (
            ", leaving out the mutants of earlier runs" if args.exclude else "")
        payload = {"command": command, "tree": _tree_commit(), "sample": args.sample, "seed": args.seed, "scope": scope,
                   "total_mutants": len(everything),
                   "map": {"seconds": cov["seconds"], "failed": cov["failed"], "tests": len(cov["durations"])},
                   "mutants": []}
        earlier = args.out / "mutation.json"
        again = {c.mutant.id for c in chosen}
        if args.reselect:  # the recorded run, with these survivors' results replaced where they now die
            payload = json.loads(earlier.read_text())
            payload["reselected"] = sorted(set(payload.get("reselected", [])) | again)
        elif args.ids and earlier.is_file():  # survivors run again in several goes: one file of their latest results
            payload["mutants"] = [m for m in json.loads(earlier.read_text())["mutants"] if m["id"] not in again]
            payload["command"] = "several runs of python tests/mutation/mutation_score.py --ids ... (--tests ...)"
        # Each job has its own copy of the checkout; results are recorded in the drawn order (a mutant only
        # once those drawn before it are done), so a run stopped early is still a random sample.
        copies = queue.Queue()
        copies.put(copy_root)
        for k in range(1, max(args.jobs, 1)):
            extra = Path(tempfile.mkdtemp(prefix=f"job{k}-", dir=tmp))
            _copy_checkout(extra)
            copies.put(extra)

        def run_one(candidate: Candidate) -> tuple[Mutant, int]:
            mutant, tests = candidate.mutant, tests_for(candidate, cov, copy_root)
            if not tests:
                mutant.status = "survived (no fast test runs it)"
                return mutant, 0
            root = copies.get()
            try:
                path = root / mutant.module
                original = path.read_text()
                path.write_text(mutated_source(candidate, root))
                limit = 60 + 5 * sum(cov["durations"].get(t, 0.0) for t in tests)
                try:
                    mutant.status, mutant.seconds, mutant.killed_by = _run_tests(root, tests, limit)
                finally:
                    path.write_text(original)
            finally:
                copies.put(root)
            return mutant, len(tests)

        with concurrent.futures.ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            for i, (mutant, n_tests) in enumerate(pool.map(run_one, chosen), 1):
                if args.reselect:
                    payload["mutants"] = [asdict(mutant) if m["id"] == mutant.id else m for m in payload["mutants"]]
                else:
                    payload["mutants"].append(asdict(mutant))
                _write_json(args.out / "mutation.json", payload)
                print(f"[{i}/{len(chosen)}] {mutant.status:9} {mutant.seconds:5.1f}s {n_tests:4} tests {mutant.id}  "
                      f"{mutant.before!r} -> {mutant.after!r}", flush=True)

    (args.out / "mutation.md").write_text(_report(payload))
    print((args.out / "mutation.md").read_text())


if __name__ == "__main__":
    main()
