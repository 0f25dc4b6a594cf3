"""How many plausible one-line bugs the tests catch: a mutation run over the scoring, data and file-writing
code.

    python scripts/mutation_score.py                      # the recorded run: 150 mutants, seed 0 (~1.5 h on 2 cores)
    python scripts/mutation_score.py --sample 20          # a quick look
    python scripts/mutation_score.py --list               # every mutant, without running anything
    python scripts/mutation_score.py --ids <id> ...       # some again (the survivors, once tests are added)
    python scripts/mutation_score.py --report-only        # mutation.md from the recorded run and its rerun

Each mutant changes one operator, constant, condition or return value in one module (see `OPERATORS`),
in a copy of the package (the checkout is never touched), and runs the test files that cover that module
(`TARGETS`), fast tests only (`-m "not slow"`), stopping at the first failure. A mutant is *killed* when a
test fails (or the run exceeds its timeout), *survived* otherwise. Mutants are drawn at random (seeded)
from all those of the target modules, so the score estimates the score of all of them; its 95% interval
is given. Survivors judged equivalent (no behaviour a user could see changes) are listed in `EQUIVALENT`
with the reason, and the score counts non-equivalent mutants only. Results go to
bench/results/mutation.json and bench/results/mutation.md. Run outside CI: it is slow.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_METRIC_TESTS = ["tests/test_metrics.py", "tests/test_metrics_text.py", "tests/test_metrics_reducer.py",
                 "tests/test_metrics_properties.py"]
_DATA_TESTS = ["tests/test_data.py", "tests/test_packing.py", "tests/test_real_tokenizer.py",
               "tests/test_tiny_tokenizer.py"]
# Module -> the test files that cover it.
TARGETS: dict[str, list[str]] = {
    "llasmol/metrics/extract.py": _METRIC_TESTS,
    "llasmol/metrics/families.py": _METRIC_TESTS,
    "llasmol/metrics/formula.py": _METRIC_TESTS,
    "llasmol/metrics/molecules.py": _METRIC_TESTS,
    "llasmol/metrics/scoring.py": _METRIC_TESTS,
    "llasmol/metrics/text.py": _METRIC_TESTS,
    "llasmol/metrics/reducer.py": _METRIC_TESTS,
    "llasmol/data/formatting.py": _DATA_TESTS,
    "llasmol/data/collate.py": _DATA_TESTS,
    "llasmol/data/sampler.py": _DATA_TESTS,
    "llasmol/core/files.py": ["tests/test_files.py"] + [f"tests/test_faults.py::{name}" for name in (
        "test_a_kill_while_writing_predictions_leaves_the_old_file_whole",
        "test_checkpoints_are_written_through_a_rename_in_their_own_folder",
        "test_an_adapter_save_stopped_between_its_renames_leaves_the_previous_one_readable",
        "test_written_files_and_adapter_folders_respect_the_umask",
        "test_temporaries_of_dead_writers_are_removed_and_those_of_live_ones_kept",
        "test_a_full_disk_or_read_only_folder_is_a_user_error_naming_the_file")],
}

# Survivors that change nothing a user could observe, by mutant id, with the reason (filled in after
# reading each survivor of the recorded run).
EQUIVALENT: dict[str, str] = {
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
}

# Recorded ids whose module moved since the recorded run (lines added above them): id then -> id now, for
# running those survivors again.
MOVED: dict[str, str] = {
    "llasmol/metrics/extract.py:61:8:condition:1": "llasmol/metrics/extract.py:68:8:condition:1",
}

# Survivors still not killed that are not equivalent either, with why no test kills them.
NOT_KILLED: dict[str, str] = {
    "llasmol/data/sampler.py:66:81:constant:1":
        "the index dtype switches to int64 at 3**31 instead of 2**31 samples: wrong only for splits of over "
        "2.1 billion samples (SMolInstruct has 3.3 million); a test would need an 8 GiB index",
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


def mutants(module: str) -> list[tuple[Mutant, str]]:
    """Every mutant of `module`, with its mutated source."""
    source = (ROOT / module).read_text()
    tree = ast.parse(source)
    index = {id(node): i for i, node in enumerate(ast.walk(tree))}
    out, seen = [], {}
    for node, operator, mutate in list(_edits(tree)):
        mutated = _replace(tree, index[id(node)], operator, mutate)
        new_source = ast.unparse(mutated)
        key = f"{module}:{node.lineno}:{node.col_offset}:{operator}"
        seen[key] = seen.get(key, 0) + 1
        before = ast.get_source_segment(source, node) or ast.unparse(node)
        changed = _find(mutated, index[id(node)])
        after = "pass" if operator == "statement" else ast.unparse(changed) if changed is not None else "?"
        if operator == "not":
            after = ast.unparse(node.operand)
        out.append((Mutant(f"{key}:{seen[key]}", module, node.lineno, operator, before.splitlines()[0][:100],
                           after.splitlines()[0][:100]), new_source))
    return out


def _find(tree: ast.Module, i: int):
    nodes = list(ast.walk(tree))
    return nodes[i] if i < len(nodes) else None


def _run_tests(copy_root: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    env = {**os.environ, "PYTHONPATH": str(copy_root), "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                               *tests], cwd=copy_root, env=env, capture_output=True, text=True, timeout=timeout)
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


def _report(results: list[Mutant], total: int, args, rerun: dict[str, dict] | None = None) -> str:
    """The score table and the survivors. `rerun`: survivors of the recorded run run again after tests were
    added for them (`--ids`, results in rerun/), by id -> status; both scores are shown."""
    first = [m for m in results if m.id not in EQUIVALENT]
    first_killed = sum(m.status.startswith("killed") for m in first)
    survivors = [m for m in results if not m.status.startswith("killed")]
    if rerun:
        again = {m.id: rerun.get(MOVED.get(m.id, m.id)) for m in results}
        results = [Mutant(**{**asdict(m), "status": "killed (rerun)", "killed_by": again[m.id].get("killed_by", "")})
                   if again[m.id] and again[m.id]["status"].startswith("killed") else m for m in results]
    rows = []
    for module in TARGETS:
        mine = [m for m in results if m.module == module]
        scored = [m for m in mine if m.id not in EQUIVALENT]
        killed = sum(m.status.startswith("killed") for m in scored)
        rows.append(f"| `{module}` | {len(mine)} | {len(mine) - len(scored)} | {killed}/{len(scored)} |")
    scored = [m for m in results if m.id not in EQUIVALENT]
    killed = sum(m.status.startswith("killed") for m in scored)
    lo, hi = _interval(killed, len(scored))
    lines = [
        "# Mutation score", "",
        f"`python scripts/mutation_score.py --sample {args.sample} --seed {args.seed}`: {len(results)} of "
        f"{total} mutants of the target modules, drawn at random; each run against its module's fast tests.", "",
        f"**Score: {killed}/{len(scored)} non-equivalent mutants killed = {killed / max(1, len(scored)):.1%}** "
        f"(95% interval {lo:.1%}–{hi:.1%}); {len(results) - len(scored)} judged equivalent.", "",
        *([f"The recorded run itself killed {first_killed}/{len(first)} ({first_killed / max(1, len(first)):.1%}); "
           f"tests were then added for its survivors, and those survivors run again (`--ids`, "
           f"bench/results/rerun/): {sum(r['status'].startswith('killed') for r in rerun.values())} of {len(rerun)} "
           "are killed now.", ""] if rerun else []),
        "| module | mutants run | equivalent | killed |", "|---|---|---|---|", *rows, "",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=150, help="mutants to run, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--ids", nargs="+", help="run only these mutants (e.g. the survivors of a recorded run)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite mutation.md from mutation.json (after judging survivors in EQUIVALENT)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()

    if args.report_only:
        recorded = json.loads((args.out / "mutation.json").read_text())
        results = [Mutant(**m) for m in recorded["mutants"]]
        args.sample, args.seed = recorded["sample"], recorded["seed"]
        rerun_file = args.out / "rerun" / "mutation.json"
        rerun = ({m["id"]: m for m in json.loads(rerun_file.read_text())["mutants"]}
                 if rerun_file.is_file() else None)
        (args.out / "mutation.md").write_text(_report(results, recorded["total_mutants"], args, rerun))
        print((args.out / "mutation.md").read_text())
        return
    everything = [(m, src) for module in TARGETS for m, src in mutants(module)]
    if args.list:
        for m, _ in everything:
            print(f"{m.id}\t{m.before}  ->  {m.after}")
        print(f"{len(everything)} mutants", file=sys.stderr)
        return
    if args.ids:
        chosen = [pair for pair in everything if pair[0].id in set(args.ids)]
        args.out = args.out / "rerun"
    elif args.sample:
        chosen = random.Random(args.seed).sample(everything, min(args.sample, len(everything)))
    else:
        chosen = everything
    chosen.sort(key=lambda pair: (list(TARGETS).index(pair[0].module), pair[0].line))

    with tempfile.TemporaryDirectory(prefix="llasmol-mutants-") as tmp:
        copy_root = Path(tmp)
        for part in ("llasmol", "tests", "bench", "scripts", "pyproject.toml"):
            src = ROOT / part
            (shutil.copytree if src.is_dir() else shutil.copy)(src, copy_root / part)
        # The unmutated package, written the way mutants are (ast.unparse), must pass first.
        for module in TARGETS:
            (copy_root / module).write_text(ast.unparse(ast.parse((ROOT / module).read_text())))
        for tests in {tuple(t) for t in TARGETS.values()}:
            status, _, _ = _run_tests(copy_root, list(tests), args.timeout * 2)
            if status != "survived":
                sys.exit(f"the unmutated package fails {' '.join(tests)}: fix that first")
        results = []
        for i, (mutant, source) in enumerate(chosen, 1):
            original = (copy_root / mutant.module).read_text()
            (copy_root / mutant.module).write_text(source)
            try:
                mutant.status, mutant.seconds, mutant.killed_by = _run_tests(copy_root, TARGETS[mutant.module],
                                                                             args.timeout)
            finally:
                (copy_root / mutant.module).write_text(original)
            results.append(mutant)
            print(f"[{i}/{len(chosen)}] {mutant.status:9} {mutant.seconds:5.1f}s {mutant.id}  "
                  f"{mutant.before!r} -> {mutant.after!r}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mutation.json").write_text(json.dumps(
        {"command": ("python scripts/mutation_score.py --ids " + " ".join(args.ids)) if args.ids else
                    f"python scripts/mutation_score.py --sample {args.sample} --seed {args.seed}",
         "sample": args.sample, "seed": args.seed, "total_mutants": len(everything),
         "mutants": [asdict(m) for m in results]}, indent=1) + "\n")
    (args.out / "mutation.md").write_text(_report(results, len(everything), args))
    print((args.out / "mutation.md").read_text())


if __name__ == "__main__":
    main()
