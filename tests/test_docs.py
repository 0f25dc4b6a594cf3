"""The documentation holds together: every page under docs/ is reachable from the README, and every relative
link in the README and the docs points at a file (and, for a Markdown heading anchor, a heading) that exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The file without its fenced code blocks (a `# comment` in a shell block is no heading)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ +(.+?) *$", _prose(path), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_docs_page_is_linked_from_the_readme():
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.split("#")[0]).resolve() for t in _relative_links(readme) if t.split("#")[0]}
    assert PAGES, "no docs/*.md"
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert not missing, f"README.md links no docs/{missing}"


def test_every_relative_link_points_at_something_that_exists():
    broken = []
    for page in [ROOT / "README.md", *PAGES]:
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_link_checker_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title, with `code`\n\n[ok](page.md#a-title-with-code) [bad](nowhere.md) "
                    "[web](https://example.org)\n```bash\n# not a heading\n```\n")
    assert _relative_links(page) == ["page.md#a-title-with-code", "nowhere.md"]
    assert _anchors(page) == {"a-title-with-code"}


@pytest.mark.slow
def test_the_bases_in_recipe_md_are_the_ones_params_lists(tmp_path):
    """docs/recipe.md's table of bases and `params --list` state the same facts: every `model=` choice but the
    demo's, its Hub id, its size counted on the meta device and its prompt format; the command prints them."""
    import subprocess
    import sys

    from conftest import HANG_TIMEOUT
    from llasmol.analysis.model_choices import bases_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "recipe.md").read_text(encoding="utf-8")
    table = text.split("| `model=` | Hub id |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]  # its rows
    docs = {cells[0].strip("`"): cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    listed = {row["model"]: row for row in bases_table()}
    assert set(docs) == set(listed) - {"tiny"}
    for name, row in listed.items():
        if name in ("tiny", "hf"):
            continue
        cells = docs[name]
        assert (cells[1], cells[2], cells[4]) == (row["hub_id"], f"{row['size'] / 1e9:.2f}B", row["format"]), name
    assert listed["llama2_13b"]["paper"] == "LlaSMol Large (lora=large)" and listed["qwen3"]["paper"] is None
    proc = subprocess.run([sys.executable, "-m", "llasmol.params", "--list"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["model=", "Hub", "id", "size", "vocabulary", "prompt", "the", "paper's", "model", "on", "it"]
    assert lines[1].split()[:3] == ["tiny", "-", "(bundled)"] and len(lines) == 1 + len(listed) + 2
    assert "mistral       mistralai/Mistral-7B-v0.1         7.24B   32,000      paper          LlaSMol-Mistral" in lines


def _train_commands() -> list[tuple[str, list[str]]]:
    """Every `python -m llasmol.train …` line in the README's and the docs' shell blocks, as (page, overrides):
    continuation lines joined, a sweep's comma lists split into one command a value, `<run>`-style placeholders
    filled, Hydra's own flags and settings (--multirun, hydra.*) left to Hydra."""
    commands = []
    for page in [ROOT / "README.md", *PAGES]:
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", page.read_text(), flags=re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                found = re.search(r"python -m llasmol\.train\b(.*)", line)
                if not found:
                    continue
                words = shlex.split(re.sub(r"<[a-z_]+>", "placeholder", found.group(1).split(" #")[0]))
                words = [w for w in words if not w.startswith(("--", "hydra"))]
                sweeps = [w for w in words if re.fullmatch(r"[\w.]+=[^\[{'\"]*,.*", w)]
                for i in range(max((len(w.split(",")) for w in sweeps), default=1)):
                    commands.append((page.name, [w if w not in sweeps else w.split("=")[0] + "=" +
                                                 w.split("=", 1)[1].split(",")[i] for w in words]))
    return commands


def test_every_train_command_in_the_docs_passes_the_config_check():
    """A documented command that the check refuses is a broken promise (trainer=fsdp on a real base names its
    optimizer: docs/scale-out.md)."""
    from llasmol.core.config import compose_config
    from llasmol.core.schema import check_config

    commands = _train_commands()
    assert len(commands) >= 25 and (("scale-out.md", ["lora=large", "trainer=fsdp", "optimizer=adamw",
                                                      "trainer.devices=8", "gradient_checkpointing=true"]) in commands)
    assert ("README.md", ["lora=ffn"]) in commands  # a sweep's values, one command each
    for page, overrides in commands:
        try:
            check_config(compose_config([*overrides, "paths.output_dir=/x"]))
        except Exception as error:  # noqa: BLE001 - named with the page and the command
            pytest.fail(f"{page}: python -m llasmol.train {' '.join(overrides)}: {error}")
