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

# Lower layers never import higher ones; folders of one layer do not import each other.
LAYERS = {"core": 0, "data": 1, "model": 1, "metrics": 1, "inference": 2, "training": 3, "analysis": 3, "baselines": 3,
          "": 4}
LIGHTNING_ALLOWED = {"training", "", "data/datamodule.py"}  # the LightningDataModule is data's one Lightning module


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


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_training_and_the_datamodule_use_lightning(path):
    rel = str(path.relative_to(PACKAGE))
    if folder(path) in LIGHTNING_ALLOWED or rel in LIGHTNING_ALLOWED:
        return
    used = {n for n in imported(path) if n.split(".")[0] in ("lightning", "pytorch_lightning")}
    assert not used, f"{rel} imports {sorted(used)}"


def test_the_commands_sit_on_top_and_little_else():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == ["audit", "baseline", "convert_adapter", "evaluate", "generate", "params", "report", "train"]


def _root(stem: str) -> str:
    """A module name without the endings that make look-alikes (evaluate/evaluation, resume/resumable)."""
    for ending in ("ion", "ing", "able", "s", "e"):
        if stem.endswith(ending) and len(stem) - len(ending) >= 4:
            return stem[: -len(ending)]
    return stem


def test_no_two_modules_differ_by_a_suffix_only():
    stems = sorted({p.stem for p in modules() if p.stem != "__init__"})
    for a in stems:
        for b in stems:
            assert a >= b or _root(a) != _root(b), f"{a}.py and {b}.py differ by a suffix only"


# train.py is the design card's command (`python -m llasmol.train`) over its library, training/; the command
# baseline.py and the folder baselines/ are left to the change that renames the folder.
FOLDER_LOOK_ALIKES_PENDING = {("train", "training"), ("baseline", "baselines")}


def test_no_module_looks_like_a_folder():
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    for path in modules():
        for name in folders:
            if _root(path.stem) == _root(name) and (path.stem, name) not in FOLDER_LOOK_ALIKES_PENDING:
                pytest.fail(f"{path.relative_to(ROOT)} and the folder llasmol/{name}/ differ by a suffix only")


def test_the_look_alike_check_sees_look_alikes():
    for a, b in [("evaluate", "evaluation"), ("generate", "generation"), ("resume", "resumable"),
                 ("checkpoints", "checkpointing"), ("metric", "metrics")]:
        assert _root(a) == _root(b), (a, b)


def test_the_readme_layout_names_every_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"): readme.index("## Troubleshooting")]
    for path in modules():
        if path.stem == "__init__":
            continue
        assert re.search(rf"\b{re.escape(path.name)}\b", layout), f"README's Layout does not name {path.relative_to(ROOT)}"


def test_a_plain_install_carries_the_configs_and_data(tmp_path):
    """`pip install .` (not editable) must find the configs, the bundled data, the architecture facts and the
    tiny tokenizer inside the package: every such file of the tree is in the wheel."""
    import subprocess
    import sys
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(ROOT), "--no-deps", "-w", str(tmp_path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("llasmol-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    needed = [p for sub in ("conf", "data/bundled", "model/arch", "model/tiny_tokenizer")
              for p in (PACKAGE / sub).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(needed) > 100
    missing = [str(p.relative_to(ROOT)) for p in needed if str(p.relative_to(ROOT)) not in inside]
    assert not missing, missing[:5]
