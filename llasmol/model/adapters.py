"""The adapter folder beside each Lightning checkpoint: its name, its atomic save, its fallback read, and
reading adapter weights safely (safetensors, or PEFT's old pickled `.bin` through a weights-only reader).

Next to `X.ckpt` the adapter is written in PEFT's own format to `X.adapter/` (`adapter_config.json` and
`adapter_model.safetensors`), loadable with `PeftModel.from_pretrained(base, "X.adapter")`. Training writes
it (`llasmol.finetune.checkpointing`), evaluation and generation read it (`llasmol.inference.loading`);
neither needs the other, and nothing here needs Lightning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from llasmol.core.errors import UserError
from llasmol.core.files import raise_if_unwritable, shareable_mode
from llasmol.core.run_lock import LOCK, hold_run_lock, release_run_lock

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
WEIGHTS_SAFETENSORS = "adapter_model.safetensors"
TRAINER_STATE = "trainer_state.json"  # {"global_step": N}: which optimizer step these weights are
WEIGHTS_PICKLE = "adapter_model.bin"  # PEFT before 0.7 (Mol-Instructions' Molinst, early LlaSMol releases)


def adapter_dir(ckpt_path: str | Path) -> Path:
    """The PEFT adapter folder that belongs to the Lightning checkpoint `ckpt_path`."""
    path = Path(ckpt_path)
    return path.with_name(path.stem + ".adapter")


def _previous(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def readable_adapter(target: Path) -> Path:
    """`target`, or the adapter it replaces when a save stopped between its two renames (the `.ckpt`,
    written after the adapter, is then still the previous one too, so the two match)."""
    if not target.exists() and (_previous(target) / ADAPTER_CONFIG).is_file():
        return _previous(target)
    return target


def stage_adapter(model, target: Path, state_dict: dict | None = None, card: str | None = None,
                  step: int | None = None) -> Path:
    """Write the adapter into a temporary folder beside `target` (named for this process, so the next start
    can tell it from a live writer's) and return it; `commit_adapter` moves it into place. Saving takes
    the time; committing is two renames. `card` replaces PEFT's empty model card (README.md); `step`, the
    optimizer step of these weights, goes to `trainer_state.json` (as Hugging Face's Trainer names it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}."))
    try:
        tmp.chmod(shareable_mode(directory=True))
        # No embedding layers: LoRA here never resizes them (and PEFT's "auto" asks the base's config for it).
        model.save_pretrained(str(tmp), state_dict=state_dict, save_embedding_layers=False)
        if card is not None:
            (tmp / "README.md").write_text(card, encoding="utf-8")
        if step is not None:
            (tmp / TRAINER_STATE).write_text(json.dumps({"global_step": int(step)}) + "\n", encoding="utf-8")
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise_if_unwritable(err, target)
        raise
    return tmp


def commit_adapter(staged: Path, target: Path) -> None:
    """A folder cannot be replaced in one rename: the old adapter steps aside, the staged one is renamed in,
    then the old one goes; `readable_adapter` covers the moment between the two renames."""
    old = _previous(target)
    try:
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        staged.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def save_adapter_atomically(model, target: Path, state_dict: dict | None = None, card: str | None = None,
                            step: int | None = None) -> None:
    commit_adapter(stage_adapter(model, target, state_dict, card, step), target)


def adapter_step(folder: Path) -> int | None:
    """The optimizer step an adapter folder was saved at (`trainer_state.json`), if it says."""
    try:
        step = json.loads((Path(folder) / TRAINER_STATE).read_text(encoding="utf-8"))["global_step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


# --------------------------------------------------------------------------- reading adapter weights


def adapter_weights(folder: Path) -> tuple[dict, bool]:
    """The adapter's tensors, and whether they came from PEFT's old pickled `adapter_model.bin`.

    safetensors is read when present; otherwise the `.bin` goes through torch's weights-only unpickler, which
    builds tensors and plain containers and refuses anything else, so nothing in the file can run code.
    """
    folder = Path(folder)
    safetensors_file = folder / WEIGHTS_SAFETENSORS
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(safetensors_file)), False
        except Exception as err:  # truncated or not safetensors at all: the same for the user
            raise UserError(f"{safetensors_file} is not a readable safetensors file ({type(err).__name__}): "
                            "copy or save the adapter again") from None
    pickle_file = folder / WEIGHTS_PICKLE
    if pickle_file.is_file():
        return read_pickled_weights(pickle_file), True
    raise UserError(f"{folder} has {ADAPTER_CONFIG} but no {WEIGHTS_SAFETENSORS} or {WEIGHTS_PICKLE}: "
                    "copy the weights too")


def read_pickled_weights(path: Path) -> dict:
    """A `{name: tensor}` pickle read with torch's weights-only unpickler (never PEFT's or torch's default)."""
    import torch

    try:
        weights = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # a crafted or broken pickle: refused before any of it could run
        reason = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        raise UserError(f"{path} is not a plain tensor file ({reason}); nothing in it was run: use an adapter "
                        f"saved as {WEIGHTS_SAFETENSORS}, or one from a source you trust") from None
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        raise UserError(f"{path} holds a {type(weights).__name__}, not a name -> tensor mapping: it is not a PEFT adapter")
    # Each tensor in storage of its own: a pickle may hold views of one buffer or one tensor under two names,
    # which safetensors refuses to write ("Some tensors share memory"); adapters are small, a copy is cheap.
    return {name: tensor.clone(memory_format=torch.contiguous_format) for name, tensor in weights.items()}


def load_adapter(model, folder: Path):
    """`model` with the adapter in `folder` loaded by PEFT, from safetensors only; the file's tensors must be
    exactly the adapter's (PEFT itself only warns about missing keys, and would load a partial adapter)."""
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    weights, pickled = adapter_weights(folder)
    try:
        if not pickled:
            peft_model = PeftModel.from_pretrained(model, str(folder))
        else:
            log.warning("%s: read %s (PEFT's old pickle format) with a weights-only reader; "
                        "`python -m llasmol.convert_adapter %s` writes a safetensors copy", folder, WEIGHTS_PICKLE, folder)
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copy(folder / ADAPTER_CONFIG, Path(tmp) / ADAPTER_CONFIG)
                save_file(weights, str(Path(tmp) / WEIGHTS_SAFETENSORS))
                peft_model = PeftModel.from_pretrained(model, tmp)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as err:
        mismatch = _SIZE_MISMATCH.search(str(err))
        if mismatch:  # torch lists every tensor over many lines: the first says it
            name, theirs, ours = mismatch.groups()
            raise UserError(f"adapter {folder} does not fit model: {name} is {theirs} in the adapter and {ours} in "
                            "the model: pass the model= and lora variant it was trained with") from None
        said = " ".join(str(err).split())  # one line
        raise UserError(f"cannot load the adapter {folder} ({type(err).__name__}: "
                        f"{said if len(said) <= 160 else said[:157] + '...'}): check ckpt= and model=") from None
    expected = set(get_peft_model_state_dict(peft_model, save_embedding_layers=False))
    missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or extra:
        detail = "; ".join(part for part in (
            f"{len(missing)} missing, e.g. {missing[0]}" if missing else "",
            f"{len(extra)} not in the model, e.g. {extra[0]}" if extra else "") if part)
        raise UserError(f"adapter {folder} does not fit model: {detail}: pass the model= and lora variant it was trained with")
    return peft_model


# torch's load_state_dict: "size mismatch for <name>: copying a param with shape torch.Size([8, 64]) from
# checkpoint, the shape in current model is torch.Size([8, 32])."
_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
                            r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)")


def load_adapter_weights(model, folder: Path) -> None:
    """Copy the adapter in `folder` into `model`'s own adapters (a PEFT model, trained on from there): every
    adapter tensor, each of its shape, or one line saying which does not fit."""
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    weights, _ = adapter_weights(folder)
    expected = get_peft_model_state_dict(model, save_embedding_layers=False)
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    shaped = [k for k in expected if k in weights and weights[k].shape != expected[k].shape]
    if missing or extra or shaped:
        what = (f"{len(missing)} missing, e.g. {missing[0]}" if missing else
                f"{len(extra)} not in the model, e.g. {extra[0]}" if extra else
                f"{shaped[0]} is {tuple(weights[shaped[0]].shape)}, not {tuple(expected[shaped[0]].shape)}")
        raise UserError(f"adapter {folder} does not fit this model's adapters ({what}): pass the model= and lora= "
                        "it was trained with")
    for module in model.modules():  # trainer=fsdp's meta base: lora=plus's head copy gets memory for its values
        for name, param in list(module._parameters.items()):  # (kept when the rest of the base is read)
            if param is not None and param.is_meta and param.requires_grad:
                module._parameters[name] = torch.nn.Parameter(torch.empty_like(param, device="cpu"))
    set_peft_model_state_dict(model, weights)


# What transformers 5 writes into tokenizer_config.json that an older release (pyproject allows them) cannot read,
# or that describes this machine rather than the tokenizer.
_TOKENIZER_CLASS_FOR_ALL = {"TokenizersBackend": "PreTrainedTokenizerFast"}  # 5's name; 4.x knows only the old one
_MACHINE_KEYS = ("is_local", "local_files_only")


def _portable_tokenizer_config(path: Path) -> None:
    """The exported tokenizer as every transformers release the package allows loads it: transformers 5 saves a
    fast tokenizer as `TokenizersBackend`, a class 4.x lacks, while both load `PreTrainedTokenizerFast` from
    the same tokenizer.json; and how this machine read its files is no fact of the tokenizer."""
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in _TOKENIZER_CLASS_FOR_ALL:
        config["tokenizer_class"] = _TOKENIZER_CLASS_FOR_ALL[config["tokenizer_class"]]
        # 4.x's PreTrainedTokenizerFast also returns token_type_ids, which generate(**inputs) refuses
        config.setdefault("model_input_names", ["input_ids", "attention_mask"])
    for key in _MACHINE_KEYS:
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@contextmanager
def export_staging(output: Path) -> Iterator[Path]:
    """The folder a merged model is written into before it is renamed to `output` (`.<name>.exporting` beside it),
    this process's alone from before the merge: a second export into the same output is one line naming the
    first, what a killed one left there is cleared, and a failure leaves nothing beside `output`."""
    staging = output.parent / f".{output.name}.exporting"
    try:
        hold_run_lock(staging, "export", fix=f"name another output= than {output}")
    except OSError as err:
        raise_if_unwritable(err, output)
        raise
    try:
        for child in staging.iterdir():
            if child.name != LOCK:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        yield staging
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise_if_unwritable(err, output)
        raise
    finally:
        release_run_lock(staging)


def save_merged(model, tokenizer, generation_config, card: str, staging: Path, output: Path,
                max_shard_size: str) -> None:
    """Write a merged model (weights as safetensors shards, tokenizer, generation config, README.md `card`) into
    `staging` (`export_staging`), make it as readable as the umask allows, and rename it into place: a stop
    midway leaves no half folder under the final name."""
    model.save_pretrained(staging, safe_serialization=True, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(staging)
    _portable_tokenizer_config(staging / "tokenizer_config.json")
    generation_config.save_pretrained(staging)
    (staging / "README.md").write_text(card, encoding="utf-8")
    (staging / LOCK).unlink()  # held still (its descriptor stays open) until the rename is done
    # some writers' files are private: the folder is for colleagues, as the umask allows
    for path in [staging, *staging.rglob("*")]:
        path.chmod(shareable_mode(directory=path.is_dir()))
    if output.is_dir():
        output.rmdir()  # an empty folder the user named (the command refuses one that holds files)
    staging.rename(output)