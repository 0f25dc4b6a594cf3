"""A base built without memory and filled once, shard by shard: how `trainer=fsdp` loads pretrained weights.

Every process builds the base's parameters on the `meta` device (shapes, no storage), LoRA puts its adapters
beside them in host memory (initialised exactly as on a loaded base: the same random draws, in the same order),
FSDP2 shards the model, and only then does each process allocate its own shard of each base tensor and read
those rows from the safetensors files. Each process reads for itself rather than rank 0 reading and
broadcasting: the files are on a disk every process reaches (the weights' folder or the Hugging Face cache),
a rank reads only its 1/W of the bytes, and no process ever holds a whole tensor it does not keep, where a
broadcast would hold each whole tensor on rank 0 and send W-1 copies over the network.

The files are read with plain reads into the shard's own memory (the format is an 8-byte header length, a JSON
header of dtype, shape and byte offsets, then raw row-major bytes: reading it runs no code), not mapped, so
the page cache never counts as the process's resident memory. Buffers (rotary frequencies) are computed as
usual while the parameters go to the meta device.
"""

from __future__ import annotations

import json
import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from llasmol.core.errors import UserError
from llasmol.core.files import read_json, unreadable
from llasmol.model.blocks import clean_name

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# safetensors' dtype names
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
           "U8": torch.uint8, "BOOL": torch.bool}
_MAX_HEADER = 100 << 20  # safetensors' own limit on a header's size

# Names PEFT puts between a base tensor's module and its own name: a LoRA layer's frozen base layer, and
# modules_to_save's frozen original and its trainable copy (lora=plus's head), both read from the base's tensor.
_PEFT_PARTS = (".base_layer.", ".original_module.", ".modules_to_save.default.")
_PEFT_ROOT = "base_model.model."


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside go to the `meta` device (no memory, no random draws); buffers are built
    as usual (a `torch.device("meta")` context would leave the rotary frequencies without values)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def adapt_meta_base(base: torch.nn.Module, adapt: Callable[[torch.nn.Module], torch.nn.Module]) -> torch.nn.Module:
    """`adapt(base)` (PEFT's `get_peft_model`) for a base whose parameters are on the meta device, with the
    adapters drawn in host memory exactly as on a loaded base.

    PEFT puts each new adapter on its base layer's device, which for a meta base would drop the values it has
    just drawn. So PEFT is shown host tensors that take no memory (one element, broadcast to the parameter's
    shape: default LoRA initialisation never reads the base's values), and every parameter that is not an
    adapter goes back to the meta device afterwards, ties kept. The head stays on the meta device throughout:
    no adapter goes on it, and lora=plus's trainable copy of it (PEFT deep-copies the head) is then a meta
    tensor too, filled from the files with the rest."""
    def swap(model: torch.nn.Module, make: Callable[[torch.Tensor], torch.Tensor], skip) -> None:
        made: dict[int, torch.nn.Parameter] = {}
        for module_name, module in model.named_modules():
            for name, param in list(module._parameters.items()):
                if param is None or skip(f"{module_name}.{name}", param):
                    continue
                if id(param) not in made:  # a tied parameter is swapped for one shared replacement
                    made[id(param)] = torch.nn.Parameter(make(param), requires_grad=param.requires_grad)
                module._parameters[name] = made[id(param)]

    head = base.get_output_embeddings()
    on_meta = {id(p) for p in head.parameters()} if head is not None else set()
    swap(base, lambda p: torch.zeros((), dtype=p.dtype).expand(p.shape), lambda name, p: id(p) in on_meta)
    adapted = adapt(base)
    prefix = getattr(getattr(adapted, "base_model", None), "prefix", None) or "lora_"
    lost = [name for name, p in adapted.named_parameters() if prefix in name and p.is_meta]
    if lost:  # an adapter on the head: this model cannot be adapted on the meta device
        raise UserError(f"LoRA targets {lost[0].split('.' + prefix)[0]}, whose weights trainer=fsdp keeps on the "
                        "meta device until sharded: leave the output head out of model.lora_targets")
    swap(adapted, lambda p: torch.empty_like(p, device="meta"), lambda name, p: prefix in name or p.is_meta)
    return adapted


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: where its bytes are, and what they hold."""
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offset in the file

    @property
    def row_bytes(self) -> int:
        return _numel(self.shape[1:]) * self.dtype.itemsize


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def read_header(path: Path) -> dict[str, Entry]:
    """The tensors of one safetensors file, checked against its size; one line for a damaged file."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(_MAX_HEADER, size - 8):
            raise UserError(f"{path} is not a safetensors file (no header): download the weights again")
        try:
            header = json.loads(fh.read(length))
        except (ValueError, UnicodeDecodeError, RecursionError):
            header = None
    if not isinstance(header, dict):
        raise UserError(f"{path} has a damaged safetensors header: download the weights again")
    entries, spans = {}, []
    base = 8 + length
    for key, info in header.items():
        if key == "__metadata__":
            continue
        info = info if isinstance(info, dict) else {}
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if info.get("dtype") not in _DTYPES or not _whole_numbers(shape) or not _whole_numbers(offsets) or \
                len(offsets) != 2:
            raise UserError(f"{path} describes tensor {key!r} in a way safetensors does not "
                            f"({json.dumps(info)[:80]}): download the weights again")
        dtype, (begin, end) = _DTYPES[info["dtype"]], offsets
        if not 0 <= begin <= end <= size - base or end - begin != _numel(shape) * dtype.itemsize:
            raise UserError(f"{path}: tensor {key!r} lies outside the file or has the wrong size: download the "
                            "weights again")
        entries[key] = Entry(path, dtype, tuple(shape), base + begin)
        spans.append((begin, end, key))
    # As safetensors itself requires: the tensors' bytes follow one another from the start of the data to its
    # end, none sharing a byte with another (overlapping ranges read one tensor's values into another)
    reached, previous = 0, None
    for begin, end, key in sorted(spans):
        if begin != reached:
            what = f"overlaps {previous!r}" if begin < reached else "leaves a gap before it"
            raise UserError(f"{path} has a damaged safetensors header: tensor {key!r} {what}: download the weights "
                            "again")
        reached, previous = end, key
    if reached != size - base:
        raise UserError(f"{path} has a damaged safetensors header: its tensors cover {reached:,} of the {size - base:,} "
                        "bytes of data: download the weights again")
    return entries


def _whole_numbers(values) -> bool:
    """A JSON list of whole numbers from 0 (not booleans, not 1e400)."""
    return isinstance(values, list) and all(type(v) is int and v >= 0 for v in values)


def weight_files(index: Path) -> list[str]:
    """The names of the safetensors files an index names (`model.safetensors` where there is no index)."""
    if not index.is_file():
        return [SINGLE_FILE]
    weight_map = read_json(index, "download the weights again", dict, "a safetensors index").get("weight_map")
    files = list(weight_map.values()) if isinstance(weight_map, dict) else []
    # Files of the folder itself, by plain name: an index cannot point a read outside it.
    if not files or not all(isinstance(f, str) and f == Path(f).name and f not in (".", "..") for f in files):
        raise UserError(f"{index} is not a safetensors index naming files of its folder: download the weights again")
    return sorted(set(files))


def weight_entries(folder: Path) -> dict[str, Entry]:
    """Every tensor of the base's safetensors files in `folder` (an index naming several files, or one file)."""
    paths = [folder / name for name in weight_files(folder / INDEX_FILE)]
    for path in paths:
        problem = unreadable(path)
        if problem == "does not exist":
            raise UserError(f"{folder} has no {path.name}: trainer=fsdp reads the base from safetensors files; point "
                            "model.path at a folder with the base's *.safetensors (`hf download <id> --local-dir "
                            "<folder>`)")
        if problem:  # a link loop, a pipe, a device: named as what it is
            raise UserError(f"{path} {problem}: the base's weights are read from regular files; download them again")
    entries: dict[str, Entry] = {}
    for path in paths:
        entries.update(read_header(path))
    return entries


@dataclass(frozen=True)
class DeferredWeights:
    """Where a meta-device base's values are: its folder of safetensors files, the prefix of its inner model's
    names (`model`), and the names each tied tensor goes by (a head tied to the embeddings is saved once)."""
    folder: Path
    prefix: str
    aliases: dict[str, tuple[str, ...]]
    renames: tuple[tuple[str, str], ...] = ()  # (pattern in the files' keys, its name in the model), in order
    files: Optional[dict[str, Entry]] = None  # the files' tensors as their headers were read at load (else at fill)

    @classmethod
    def of(cls, model: torch.nn.Module, folder: Path, renames: tuple[tuple[str, str], ...] = (),
           files: Optional[dict[str, Entry]] = None) -> "DeferredWeights":
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        aliases = {name: tuple(group) for group in names.values() if len(group) > 1 for name in group}
        return cls(folder, getattr(model, "base_model_prefix", "") or "model", aliases, renames, files)

    def entries(self) -> dict[str, Entry]:
        """The files' tensors by the names the model gives them (transformers' renaming of old checkpoints' keys,
        such as `LayerNorm.gamma` for `LayerNorm.weight`, applied as `from_pretrained` applies it)."""
        found = {}
        for key, entry in (self.files if self.files is not None else weight_entries(self.folder)).items():
            for pattern, name in self.renames:
                key = re.sub(pattern, name, key)
            found[key] = entry
        return found

    def key(self, name: str, entries: dict[str, Entry]) -> str:
        """The key in the files of the base tensor that a (PEFT, FSDP2, compiled) model's parameter `name`
        holds."""
        name = clean_name(name).removeprefix(_PEFT_ROOT)
        for part in _PEFT_PARTS:
            name = name.replace(part, ".")
        for alias in self.aliases.get(name, (name,)):
            # A checkpoint of the bare model has no `model.` before its names, one of the whole model has.
            for key in (alias, alias.removeprefix(self.prefix + "."), f"{self.prefix}.{alias}"):
                if key in entries:
                    return key
        raise UserError(f"the base's safetensors files in {self.folder} have no tensor {name!r}: they hold another "
                        "architecture than their config.json says, or they are incomplete")


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The first row and the number of rows of process `rank`'s share of a tensor of `rows` rows sharded over
    `world` processes along its first dimension, as FSDP2 splits it (torch.chunk: ceil(rows / world) each, the
    last shares shorter or empty)."""
    chunk = -(-rows // world)
    first = min(rank * chunk, rows)
    return first, min(chunk, rows - first)


def _my_rows(tensor: torch.Tensor, local: torch.Tensor) -> int:
    """The first row of `tensor` (a parameter, or a DTensor's Shard(0)) that this process's `local` holds."""
    from torch.distributed.tensor import DTensor

    rows = tensor.shape[0] if tensor.dim() else 1
    if not isinstance(tensor, DTensor):
        return 0
    first, count = shard_rows(rows, tensor.device_mesh.size(), tensor.device_mesh.get_local_rank())
    if local.shape[0] != count:  # FSDP2 split otherwise than torch.chunk: reading rows by guess would be wrong
        raise RuntimeError(f"FSDP2 gave this process {local.shape[0]} of {rows} rows, not {count}")
    return first


def read_rows(entry: Entry, first: int, into: torch.Tensor) -> None:
    """Rows `first`... of `entry`, as many as `into` has, read straight into `into` (cast when the dtypes
    differ)."""
    count = into.shape[0] if into.dim() else 1
    target = into if into.dtype == entry.dtype and into.is_contiguous() and into.device.type == "cpu" else \
        torch.empty(into.shape, dtype=entry.dtype, device="cpu")
    if count:
        view = target.reshape(-1).view(torch.uint8).numpy()
        with entry.file.open("rb") as fh:
            fh.seek(entry.start + first * entry.row_bytes)
            if fh.readinto(view) != view.nbytes:
                raise UserError(f"{entry.file} ends early: download the weights again")
    if target is not into:
        into.copy_(target)


def check_finite(name: str, values: torch.Tensor, where) -> None:
    """A base's floating tensor holds numbers: a NaN or infinity there (a damaged or badly converted file) would
    end training at its first step with advice that cannot help (lower the learning rate)."""
    if values.is_floating_point() and values.numel() and not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).sum())
        raise UserError(f"the base's tensor {name} in {where} holds {bad:,} NaN or infinite value(s) of "
                        f"{values.numel():,}: the weights are damaged; download them again")


def fill_from_files(model: torch.nn.Module, weights: DeferredWeights, device: torch.device) -> int:
    """Give every parameter still on the meta device its memory on `device` and its values: its own rows of
    the base's tensor (a process's shard under FSDP2, the whole tensor otherwise). Parameters and buffers that
    already have values (the adapters, the rotary frequencies) keep them. Returns the bytes read."""
    from torch.distributed.tensor import DTensor

    entries = weights.entries()
    kept = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.device.type != "meta":
            if isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad:
                raise UserError(f"the base's {name} has values before its files are read (its code makes its "
                                "weights itself): trainer=fsdp cannot read this base shard by shard; use trainer=ddp")
            kept[name] = local.detach().clone()
    tied: dict[int, list[tuple[torch.nn.Module, str]]] = {}  # a tensor held by several modules (a tied head)
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                tied.setdefault(id(param), []).append((module, name))
    model.to_empty(device=device)  # FSDP2 re-points its shards at the new memory; everything needs filling now
    for (first, first_name), *others in tied.values():  # to_empty gave each holder a tensor of its own
        for module, name in others:
            module._parameters[name] = first._parameters[first_name]
    read = 0
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            if name in kept:
                local.copy_(kept.pop(name))
                continue
            key = weights.key(name, entries)  # the tensor's name in the files: what a damaged one is named by
            entry = entries[key]
            if entry.shape != tuple(tensor.shape):
                raise UserError(f"{entry.file.name}: tensor {name} has shape {list(entry.shape)}, the model built "
                                f"from config.json needs {list(tensor.shape)}: the config.json is not the weights'")
            if entry.dtype.is_floating_point != local.dtype.is_floating_point:  # I32 bytes read as F32: noise
                raise UserError(f"{entry.file} has a damaged safetensors header: tensor {key} is stored as "
                                f"{str(entry.dtype).removeprefix('torch.')}, and the model's is "
                                f"{str(local.dtype).removeprefix('torch.')}: download the weights again")
            read_rows(entry, _my_rows(tensor, local), local)
            check_finite(key, local, entry.file)
            read += local.nbytes
    return read
