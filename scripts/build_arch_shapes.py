"""Write llasmol/model/arch_shapes.json: the shapes of every bundled architecture, read from its meta build.

    python scripts/build_arch_shapes.py            # after changing a facts file, the tiny tokenizer, or transformers

`params` counts a bundled base from these (`llasmol.model.shapes`); each entry names the hash of the facts it was
built from, so a changed facts file is built again rather than read stale. tests/test_arch_shapes.py rebuilds
every entry and compares.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers

from llasmol.model.base import ARCH_DIR, arch_config
from llasmol.model.shapes import SHAPES_FILE, Shapes, facts_key


def built_shapes(arch: str) -> Shapes:
    """`arch` built on the meta device, read into shapes (a tiny base with its tokenizer's vocabulary)."""
    from transformers import AutoModelForCausalLM

    overrides = {}
    if arch.startswith("tiny"):
        from llasmol.core.config import compose_config
        from llasmol.model.base import load_tokenizer

        overrides["vocab_size"] = len(load_tokenizer(compose_config([], "params").model))
    with torch.device("meta"):
        return Shapes.of(AutoModelForCausalLM.from_config(arch_config(arch, **overrides)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SHAPES_FILE)
    out = parser.parse_args().out
    architectures = {}
    for facts in sorted(ARCH_DIR.glob("*.json")):
        arch = facts.stem
        architectures[arch] = {"facts": facts_key(arch), **built_shapes(arch).to_json()}
    # One line a part: a diff after a transformers upgrade shows which modules changed.
    lines = ["{", f' "transformers": {json.dumps(transformers.__version__)},', ' "architectures": {']
    for i, (arch, entry) in enumerate(architectures.items()):
        parts = ",\n".join(f"    {json.dumps(part)}" for part in entry["parts"])
        lines.append(f'  {json.dumps(arch)}: {{"facts": {json.dumps(entry["facts"])}, "head": {json.dumps(entry["head"])}, '
                     f'"vocab_size": {json.dumps(entry["vocab_size"])}, "parts": [\n{parts}\n  ]}}'
                     + ("," if i < len(architectures) - 1 else ""))
    lines += [" }", "}"]
    out.write_text("\n".join(lines) + "\n")
    json.loads(out.read_text())  # what was written reads back
    print(f"wrote {out} ({len(architectures)} architectures)")


if __name__ == "__main__":
    main()
