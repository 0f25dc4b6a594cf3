"""Lightning's private names that llasmol touches are all still there, and the pin says which Lightning."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from llasmol.finetune.lightning_private import TOUCH_POINTS, missing_touch_points

ROOT = Path(__file__).resolve().parents[1]


def test_every_private_touch_point_exists_in_the_installed_lightning():
    assert missing_touch_points() == []
    assert len(TOUCH_POINTS) >= 10 and all(why for *_, why in TOUCH_POINTS)  # each says why


def test_lightning_is_pinned_to_the_minor_version_tested():
    pin = re.search(r'"lightning>=(\d+)\.(\d+),<(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins lightning to one minor version"
    low, high = (int(pin[1]), int(pin[2])), (int(pin[3]), int(pin[4]))
    installed = tuple(int(x) for x in version("lightning").split(".")[:2])
    assert low <= installed < high and high == (low[0], low[1] + 1)


def test_no_private_lightning_name_is_used_outside_its_module():
    """Only llasmol/finetune/lightning_private.py names Lightning's private attributes."""
    names = {attr for _, _, attr, _, _ in TOUCH_POINTS if attr.startswith("_")}
    for path in (ROOT / "llasmol").rglob("*.py"):
        if path.name == "lightning_private.py":
            continue
        text = path.read_text()
        used = {n for n in names if re.search(rf"\.{re.escape(n)}\b", text)}
        assert not used, f"{path.relative_to(ROOT)} uses {sorted(used)}: go through lightning_private"
