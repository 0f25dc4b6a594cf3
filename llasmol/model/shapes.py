"""A base's modules as shapes and counts, without torch: what `params` counts, and how it counts fast.

`Shapes.of(model)` reads a model (built on the `meta` device) into parts: each module's own parameters (tied
ones counted once, at the first module that holds them), the (out, in) features of a linear layer, and the
blocks' repeats (`model.layers.*.mlp.up_proj`, 32 times). Counting the parameters, the adapters a LoRA variant
adds (`llasmol.model.lora.count_with_adapters`) and the weight bytes (`llasmol.model.memory.weight_bytes`) reads
only these.

Building a base on the meta device costs `params` seconds for a sum: transformers imports its modelling code
(`modeling_qwen3` and the loading machinery behind it: some 2 s, against 2 s for `import torch,
transformers` itself). So the shapes of every bundled architecture are kept in `arch_shapes.json`, written by
`scripts/build_arch_shapes.py` from the meta build, and each entry names the hash of the facts it was built
from (`llasmol/model/arch/<arch>.json`, and the tiny tokenizer that sets the tiny bases' vocabulary): an
architecture whose facts changed since, or a folder's (`model=hf`), is built and read as before.
tests/test_arch_shapes.py rebuilds every entry with the installed transformers and compares.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


SHAPES_FILE = Path(__file__).resolve().parent / "arch_shapes.json"
ARCH_DIR = Path(__file__).resolve().parent / "arch"
TINY_TOKENIZER = Path(__file__).resolve().parent / "tiny_tokenizer" / "tokenizer.json"
_INDEX = re.compile(r"\.\d+(?=\.|$)")  # a block's index in a qualified name: "model.layers.12.mlp"
LINEAR, CONV1D, MODULE = "linear", "conv1d", "module"


@dataclass(frozen=True)
class Part:
    name: str  # qualified module name; within a repeated block its index is '*' ("model.layers.*.mlp.up_proj")
    kind: str  # linear | conv1d (GPT-2's) | module
    numel: int  # its own parameters (not its children's); a tied parameter counted at its first module only
    own: int  # its own parameters, tied ones too (a trainable copy of a tied head copies them all)
    shape: tuple[int, ...] = ()  # a linear layer's (out, in) features; a Conv1D's weight shape (in, out)
    repeat: int = 1

    def features(self) -> int:
        """in + out: what a LoRA adapter of rank 1 on this layer adds."""
        return sum(self.shape)


@dataclass(frozen=True)
class Shapes:
    parts: tuple[Part, ...]
    head: Optional[str]  # the output head's module name (the model's output embeddings), None without one
    vocab_size: Optional[int] = None

    @classmethod
    def of(cls, model) -> "Shapes":
        """The shapes of `model` (any device, `meta` included)."""
        import torch
        from transformers.pytorch_utils import Conv1D

        head_module = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        head, seen, rows = None, set(), []
        for name, module in model.named_modules():
            if module is head_module and head is None:
                head = name
            params = list(module.parameters(recurse=False))
            numel = sum(p.numel() for p in params if id(p) not in seen)
            seen.update(id(p) for p in params)
            if isinstance(module, torch.nn.Linear):
                kind, shape = LINEAR, (module.out_features, module.in_features)
            elif isinstance(module, Conv1D):
                kind, shape = CONV1D, tuple(module.weight.shape)
            elif params:
                kind, shape = MODULE, ()
            else:
                continue  # a container: its parameters are its children's
            rows.append(Part(name, kind, numel, sum(p.numel() for p in params), shape))
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        return cls(_repeats(rows), head, vocab)

    def total(self) -> int:
        return sum(p.numel * p.repeat for p in self.parts)

    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def to_json(self) -> dict[str, Any]:
        return {"head": self.head, "vocab_size": self.vocab_size,
                "parts": [[p.name, p.kind, p.numel, p.own, list(p.shape), p.repeat] for p in self.parts]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Shapes":
        return cls(tuple(Part(n, k, numel, own, tuple(shape), repeat) for n, k, numel, own, shape, repeat in data["parts"]),
                   data["head"], data.get("vocab_size"))


def _repeats(rows: list[Part]) -> tuple[Part, ...]:
    """`rows` with the blocks folded: parts whose names differ only by a block index, and that are alike, are one
    part repeated (a block unlike the others keeps its own names)."""
    groups: dict[str, list[Part]] = {}
    for row in rows:
        groups.setdefault(_INDEX.sub(".*", row.name, count=1), []).append(row)
    folded = []
    for pattern, members in groups.items():
        first = members[0]
        if len(members) > 1 and all((m.kind, m.numel, m.own, m.shape) == (first.kind, first.numel, first.own, first.shape)
                                    for m in members):
            folded.append(Part(pattern, first.kind, first.numel, first.own, first.shape, len(members)))
        else:
            folded.extend(members)
    return tuple(folded)


def facts_key(arch: str) -> Optional[str]:
    """The hash of what the bundled architecture `arch` is built from (its facts file; for a tiny base, its
    tokenizer too, which sets the vocabulary); None when `arch` is not bundled."""
    facts = ARCH_DIR / f"{arch}.json"
    if not facts.is_file():
        return None
    digest = hashlib.sha256(facts.read_bytes())
    if arch.startswith("tiny"):
        digest.update(TINY_TOKENIZER.read_bytes())
    return digest.hexdigest()


def bundled_shapes(arch: str) -> Optional[Shapes]:
    """The kept shapes of bundled architecture `arch`, when its facts are those they were built from."""
    key = facts_key(arch)
    if key is None:
        return None
    entry = _kept().get(arch)
    return Shapes.from_json(entry) if entry and entry.get("facts") == key else None


@functools.lru_cache(maxsize=1)
def _kept() -> dict[str, Any]:
    """`arch_shapes.json`'s architectures, read once a process (`params --list` asks for 13)."""
    if not SHAPES_FILE.is_file():
        return {}
    return json.loads(SHAPES_FILE.read_text(encoding="utf-8")).get("architectures", {})
