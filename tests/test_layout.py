"""The package's layout holds: layers point one way, inference never needs Lightning, the README lists every
module. Imports are read from the source (module level and inside functions alike)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llasmol"

# Lower layers never import higher ones; folders of one layer do not import each other. The leakage audit reads
# data and core, and renders its report with analysis's tables, so it sits above analysis; its command above it.
LAYERS = {"core": 0, "data": 1, "model": 1, "metrics": 1, "inference": 2, "finetune": 3, "analysis": 3, "classical": 3,
          "leakage": 4, "": 5}
LIGHTNING_ALLOWED = {"finetune", "", "data/datamodule.py"}  # the LightningDataModule is data's one Lightning module


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "bundled" not in p.parts)


def folder(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def target_folder(name: str) -> str | None:
    """The llasmol folder an imported name lives in ("" for the commands), None outside llasmol."""
    parts = name.split(".")
    if parts[0] != "llasmol" or len(parts) == 1:
        return None
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "" if (PACKAGE / f"{parts[1]}.py").is_file() else None


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_layers(path):
    here = folder(path)
    for name in imported(path):
        there = target_folder(name)
        if there is None or there == here:
            continue
        assert LAYERS[there] < LAYERS[here], f"{path.relative_to(ROOT)} imports {name} ({there} is not below {here or 'the commands'})"


def late_internal_imports() -> list[tuple[str, int, bool]]:
    """Each import of a llasmol module inside a function: (module, line, whether a comment says why: on its line or
    on the comment lines just above it, or the import above it in an unbroken run of imports has one)."""
    found = []
    for path in modules():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                name = inner.module if isinstance(inner, ast.ImportFrom) else (
                    inner.names[0].name if isinstance(inner, ast.Import) else None)
                if not name or not name.startswith("llasmol"):
                    continue
                at = inner.lineno - 1
                said = "#" in lines[at]
                while not said and at > 0 and (lines[at - 1].strip().startswith(("from ", "import ", "#"))
                                               or not lines[at - 1].strip()):
                    at -= 1  # a comment above a run of imports, or on one of them, serves the run
                    said = "#" in lines[at]
                found.append((f"{path.relative_to(PACKAGE)}:{inner.lineno}", inner.lineno, said))
    return sorted(set(found))


def test_imports_inside_functions_are_few_and_each_says_why():
    """Issue #49: at most 30 imports of llasmol modules inside functions, each with the reason it is late (a
    command's checks before torch, matplotlib for closing lines only, a cycle), in a comment beside or above it."""
    late = late_internal_imports()
    assert len(late) <= 30, [where for where, _, _ in late]
    assert [where for where, _, said in late if not said] == []


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_finetune_and_the_datamodule_use_lightning(path):
    rel = str(path.relative_to(PACKAGE))
    if folder(path) in LIGHTNING_ALLOWED or rel in LIGHTNING_ALLOWED:
        return
    used = {n for n in imported(path) if n.split(".")[0] in ("lightning", "pytorch_lightning")}
    assert not used, f"{rel} imports {sorted(used)}"


def test_the_commands_sit_on_top_and_little_else():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == ["audit", "baseline", "cli", "convert_adapter", "evaluate", "export", "frame", "generate", "params",
                   "report", "train"]


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def _root(stem: str) -> str:
    """A module name without the endings that make look-alikes (evaluate/evaluation, resume/resumable), taken off
    while one is left, so that two endings are one (baselines/baseline)."""
    shorter = next((stem[: -len(e)] for e in ("ion", "ing", "able", "s", "e")
                    if stem.endswith(e) and len(stem) - len(e) >= 4), stem)
    return stem if shorter == stem else _root(shorter)


def look_alikes(names: set[str]) -> list[tuple[str, str]]:
    """Pairs of names (modules as `x.py`, folders as `x/`) that differ by a suffix only; one name found twice (two
    `smiles.py` in two folders) is not a pair."""
    bare = {name: name.removesuffix(".py").removesuffix("/") for name in names}
    return [(a, b) for a in sorted(names) for b in sorted(names) if a < b and _root(bare[a]) == _root(bare[b])]


def test_no_two_modules_or_folders_differ_by_a_suffix_only():
    names = {p.name for p in modules() if p.stem != "__init__"} | {f"{p.name}/" for p in packages()}
    found = look_alikes(names)
    assert not found, f"names that differ by a suffix only: {sorted(found)}"


def test_the_look_alike_check_sees_look_alikes():
    for a, b in [("evaluate", "evaluation"), ("generate", "generation"), ("resume", "resumable"),
                 ("checkpoints", "checkpointing"), ("metric", "metrics"), ("baseline", "baselines")]:
        assert _root(a) == _root(b), (a, b)
    # a module beside a folder, two folders, two modules; a name repeated in two folders is no pair
    assert look_alikes({"baseline.py", "baselines/", "core/"}) == [("baseline.py", "baselines/")]
    assert look_alikes({"metric/", "metrics/", "smiles.py"}) == [("metric/", "metrics/")]
    assert look_alikes({"records.py", "record.py", "predictions.py"}) == [("record.py", "records.py")]
    assert look_alikes({"classical/", "baseline.py", "analysis/"}) == []


def test_the_architecture_page_names_every_module_and_the_readme_every_folder():
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules_list = page[page.index("## Modules"):]
    for path in modules():
        if path.stem == "__init__":
            continue
        assert re.search(rf"\b{re.escape(path.name)}\b", modules_list), \
            f"docs/architecture.md's Modules does not name {path.relative_to(ROOT)}"
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"): readme.index("## Troubleshooting")]
    for package in [*packages(), ROOT / "conf"]:
        if package.parent in (PACKAGE, ROOT):
            assert f"`{package.name}/`" in layout, f"README's Layout does not name {package.name}/"
    layers = page[page.index("## The layers"): page.index("## One sample")]
    for name in LAYERS:
        if name:
            assert re.search(rf"^ *\d? +{name}/", layers, flags=re.M), f"docs/architecture.md's layers lack {name}/"


@pytest.mark.slow
def test_a_plain_install_carries_the_configs_and_data(tmp_path):
    """`pip install .` (not editable) must find the configs, the bundled data, the architecture facts and the
    tiny tokenizer inside the package, and every module: each such file of the tree is in the wheel. The configs
    sit at the top of the checkout (`conf/`) and travel as `llasmol/conf/` (setup.py's package-dir)."""
    import subprocess
    import sys
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(ROOT), "--no-deps", "-w", str(tmp_path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Package would be ignored" not in proc.stderr, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("llasmol-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())

    def files(top: Path, sub: str) -> list[Path]:
        return [p for p in (top / sub).rglob("*") if p.is_file() and "__pycache__" not in p.parts]

    needed = {str(p.relative_to(ROOT)): str(p.relative_to(ROOT))
              for sub in ("data/bundled", "model/arch", "model/tiny_tokenizer") for p in files(PACKAGE, sub)}
    needed.update((str(p.relative_to(ROOT)), str(p.relative_to(ROOT))) for p in modules())
    needed.update((str(p.relative_to(ROOT)), f"llasmol/{p.relative_to(ROOT)}") for p in files(ROOT, "conf"))
    assert sum(where.startswith("llasmol/conf/") for where in needed.values()) > 80
    missing = [tree for tree, where in needed.items() if where not in inside]
    assert not missing, missing[:5]

    # Installed from the wheel (not this checkout), a command finds its configs there.
    import os

    target = tmp_path / "installed"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import llasmol.core.config as c; print(c.CONFIG_DIR)"
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                           timeout=HANG_TIMEOUT)
    assert where.stdout.strip() == str(target / "llasmol" / "conf"), where.stderr[-2000:]
    job = subprocess.run([sys.executable, "-m", "llasmol.train", "--cfg", "job", "model=mistral", "lora=full"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG_TIMEOUT)
    assert job.returncode == 0 and "hf_id: mistralai/Mistral-7B-v0.1" in job.stdout, job.stderr[-2000:]


def test_the_configs_sit_at_the_top_of_the_checkout():
    """The design card's layout: `conf/` beside `llasmol/`, and the commands read it from there."""
    from llasmol.core.config import CONFIG_DIR

    assert not (PACKAGE / "conf").exists()
    assert CONFIG_DIR == ROOT / "conf"
    assert (CONFIG_DIR / "train.yaml").is_file()


def test_the_package_never_evaluates_text():
    pattern = re.compile(r"(?<![\w.])(eval|exec)\s*\(")
    offenders = [f"{p}:{n}" for p in (ROOT / "llasmol").rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_the_task_table_is_made_in_one_module_and_held_by_no_module_as_state():
    """Tasks are a value (`llasmol.core.tasks.TaskTable`): only core/tasks.py makes a table's rows, a run's own
    tasks reach a table through `TaskTable(...)`/`with_declared` (the schema's `checked_tasks`, a run's
    `read_tasks`), and no module keeps a table it changes: no `global` statement names one."""
    makes = re.compile(r"\bTaskTable\(|\bwith_declared\(")
    makers = sorted({p.relative_to(ROOT).as_posix() for p in (ROOT / "llasmol").rglob("*.py")
                     for line in p.read_text().splitlines() if makes.search(line) and not line.lstrip().startswith("#")})
    # tasks.py defines both; schema.checked_tasks declares a config's or a file's; pairs.py reads two runs together.
    assert makers == ["llasmol/analysis/pairs.py", "llasmol/core/schema.py", "llasmol/core/tasks.py"]
    tasks_source = (ROOT / "llasmol" / "core" / "tasks.py").read_text()
    assert "global " not in tasks_source and "_BY_NAME" not in tasks_source


def test_remote_code_is_off_and_weights_load_from_safetensors():
    from conftest import compose_config

    for model in ("mistral", "llama2", "llama2_13b", "codellama", "galactica", "tiny"):
        assert compose_config([f"model={model}", "paths.output_dir=/x"]).model.trust_remote_code is False
    source = (ROOT / "llasmol" / "model" / "base.py").read_text()
    assert "use_safetensors=True" in source


# The package's size in code lines: physical lines less blank ones, comment-only ones and docstrings (free: they
# say why). The target is 11,000 (the design issue of 2026-12-07); the package stood at 12,420 when the budget was
# first kept, 12,114 after one JSON reader, ijson and the paper's numbers as data, and folds on towards it. Raising
# the budget is this one line, its comment naming the capability that needs the lines: +106 for `params`' GPU run
# plan (training peak, epoch tokens and time).
CODE_LINE_BUDGET = 12_250


def code_lines(source: str) -> int:
    """`source`'s code lines: not blank, not only a comment, not part of a module's, class's or function's
    docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for number, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and number not in docstrings)


def test_code_lines_count_code_only():
    source = '"""A module\n\nsaying why."""\n\n# a comment\nx = 1  # counted\n\n\ndef f(a):\n    """Doc."""\n    return (a +\n            1)\n'
    assert code_lines(source) == 4  # x = 1, def f, return, its continuation


def test_the_package_keeps_its_code_line_budget():
    total = sum(code_lines(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py"))
    assert total <= CODE_LINE_BUDGET, (f"llasmol/ has {total:,} code lines, over its budget of {CODE_LINE_BUDGET:,}: "
                                       "fold what is written twice, or raise the budget naming the capability")
