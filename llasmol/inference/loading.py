"""Load a trained model for evaluation or generation from a run directory, an adapter folder or a Hub id."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from llasmol.core import offline
from llasmol.core import run_dir as layout
from llasmol.core.config import CONFIG_DIR
from llasmol.core.errors import UserError
from llasmol.core.files import read_json, unreadable
from llasmol.core.schema import ModelSchema, check_group
from llasmol.model.adapters import (ADAPTER_CONFIG, WEIGHTS_PICKLE, WEIGHTS_SAFETENSORS, adapter_dir, load_adapter,
                                    readable_adapter)
from llasmol.model.lora import DEMO_BASE, TINY_BASE, demo_weights_digest, is_demo_base, target_modules

log = logging.getLogger(__name__)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")  # owner/name; never ./x or ../x
DATAMODULE = "llasmol.data.datamodule.SMolInstructDataModule"


def resolve_checkpoint(ckpt: Optional[str], cfg: DictConfig) -> tuple[DictConfig, Optional[str], Optional[DictConfig]]:
    """(model config, adapter location or None, the run's data config or None) for `ckpt`.

    - a run directory (has `.hydra/config.yaml`): its model, and the adapter of its best checkpoint
      (by validation loss), else of `last.ckpt`;
    - a PEFT adapter folder (has `adapter_config.json`) or a Hub adapter id: the adapter over `cfg.model`;
    - None or `none`: the bare base model of `cfg.model` (asked as `prompting` says: the paper's base protocol).
    """
    if ckpt is None or str(ckpt).lower() == "none":
        log.info("no adapter: the bare base %s (ckpt=none)", cfg.model.get("hf_id") or cfg.model.get("name"))
        return cfg.model, None, None
    path = Path(ckpt)
    if (path / layout.HYDRA_CONFIG).is_file():
        run_cfg = read_run_config(path / layout.HYDRA_CONFIG)
        _check_run_data(path, run_cfg)  # its own tasks are its tasks.json's (`llasmol.core.run_dir.read_tasks`)
        return _run_model(path, run_cfg, cfg), str(_best_adapter(path)), run_cfg.data
    if (path / ADAPTER_CONFIG).is_file():
        _check_adapter_base(path, cfg.model)
        return cfg.model, str(path), None
    if path.is_symlink() and not path.exists():  # a loop, or a link to nothing: not "no adapter"
        raise UserError(f"ckpt={ckpt} {unreadable(path)}: give a run directory, an adapter folder or a Hub id")
    if path.exists() or not HUB_ID.match(str(ckpt)):
        raise UserError(
            f"ckpt={ckpt} holds no adapter: give a run directory (with .hydra/config.yaml), a folder "
            "with adapter_config.json and adapter_model.safetensors, or a Hub id owner/name"
        )
    return cfg.model, str(ckpt), None  # a Hub id such as osunlp/LlaSMol-Mistral-7B


def starting_adapter(cfg: DictConfig) -> Optional[Path]:
    """The local adapter folder `init_from` names for a training run to start from (a run directory: its best
    adapter), checked to be of this run's base and LoRA variant; None when it names none."""
    given = cfg.get("init_from")
    if given is None:
        return None
    if str(given).lower() == "none" or not Path(given).exists():
        raise UserError(f"init_from={given} is no run directory or adapter folder here: give one (a Hub adapter "
                        "must be downloaded first), or drop init_from to start from fresh adapters")
    try:
        model_cfg, adapter, _ = resolve_checkpoint(str(given), cfg)
    except UserError as err:
        raise UserError(str(err).replace("ckpt=", "init_from=")) from None
    if model_cfg.get("name") != cfg.model.get("name"):
        raise UserError(f"init_from={given} was trained with model={model_cfg.get('name')}, this run is "
                        f"model={cfg.model.get('name')}: pass model={model_cfg.get('name')}, or another init_from")
    config = adapter_config(Path(adapter), "init_from")
    saved = config.get("target_modules")
    saved = sorted(saved) if isinstance(saved, list) else saved
    wanted = sorted(target_modules(cfg.model, cfg.lora))
    if config.get("r") != cfg.lora.r or saved != wanted:
        raise UserError(f"init_from={given} holds rank-{config.get('r')} adapters on {saved}, this run's "
                        f"lora={cfg.lora.name} is rank {cfg.lora.r} on {wanted}: pass the lora= it was trained with")
    return Path(adapter)


# Hydra writes plain YAML: no tags beyond the core schema's, no anchors or aliases, a few kilobytes.
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq"))
MAX_RUN_CONFIG_BYTES = 1_000_000


def read_run_config(path: Path) -> DictConfig:
    """A run directory's `.hydra/config.yaml`, read as data in bounded time and memory: its size, YAML tags
    (`!!python/object`, `!foo`), aliases (nine nested aliases of nine make 9^9 nodes) and duplicate keys are
    checked before OmegaConf builds anything; each is one line naming the file (and the line)."""
    import yaml

    fix = "evaluate only run directories written by llasmol.train"
    size = path.stat().st_size
    if size > MAX_RUN_CONFIG_BYTES:
        raise UserError(f"{path} is {size:,} bytes, far more than llasmol.train writes: {fix}")
    try:
        text = path.read_text(encoding="utf-8")
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = getattr(event.start_mark, "line", -1) + 1
            if isinstance(event, yaml.AliasEvent):
                raise UserError(f"{path} line {line} uses a YAML alias (*{event.anchor}), which llasmol.train never "
                                f"writes and which can expand without bound: {fix}")
            tag = getattr(event, "tag", None)
            if tag is not None and tag not in _PLAIN_TAGS and not isinstance(event, yaml.DocumentStartEvent):
                raise UserError(f"{path} line {line} has the YAML tag {tag}, which llasmol.train never writes: {fix}")
        cfg = OmegaConf.create(text)
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text: {fix}") from None
    except yaml.YAMLError as err:  # duplicate keys, broken syntax
        why = " ".join(str(err).split())[:160]
        raise UserError(f"{path} is not the YAML llasmol.train writes ({why}): {fix}") from None
    if not isinstance(cfg, DictConfig):
        raise UserError(f"{path} holds a YAML list, not the mapping llasmol.train writes: {fix}")
    return cfg


def _model_chosen() -> bool:
    """Whether this command's line chose a base (`model=...`): a run directory's own base is used otherwise."""
    return HydraConfig.initialized() and any(o.startswith("model=") for o in HydraConfig.get().overrides.task)


def _run_model(run_dir: Path, run_cfg: DictConfig, cfg: DictConfig) -> DictConfig:
    """A run directory's model section, read as data: the fields of the model schema only, each of its type
    (`llasmol.core.schema.ModelSchema`), and remote code only when this command's own configuration asks for it
    (`model.trust_remote_code=true`), never because a file on disk says so."""
    where = f"{run_dir}/{layout.HYDRA_CONFIG}"
    model = run_cfg.get("model")  # a missing or scalar section is the one line below, not OmegaConf's ValueError
    model = OmegaConf.to_container(model, resolve=False) if isinstance(model, DictConfig) else None
    if not isinstance(model, dict) or not model:
        raise UserError(f"{where} has no model section: evaluate only run directories written by llasmol.train")
    fields = {f.name for f in dataclasses.fields(ModelSchema)}
    for key, value in model.items():
        if key not in fields:
            raise UserError(f"{where} has model.{key}={str(value)[:60]!r}, which llasmol.train does not write: "
                            "evaluate only run directories written by llasmol.train")
    try:
        check_group(model, ModelSchema, "model.")
    except UserError as err:
        raise UserError(f"{where} is not a run's config ({err}): evaluate only run directories written by "
                        "llasmol.train") from None
    if model.get("tokenizer") not in (None, "tiny"):
        raise UserError(f"{where} has model.tokenizer={str(model['tokenizer'])[:80]!r}, which llasmol.train does not "
                        "write (its runs name no tokenizer but the tiny one): evaluate only run directories written "
                        "by llasmol.train")
    # A run written by an older llasmol lacks the settings added since: they take the value every base shares
    # (conf/model_family/base.yaml), as a run started now would.
    shared = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model_family" / "base.yaml"))
    model = {**{k: v for k, v in shared.items() if k in fields}, **model}
    if _model_chosen() and cfg.model.get("name") != model.get("name"):  # it would be passed over without a word
        raise UserError(f"ckpt={run_dir} is a run of model={model.get('name')}, and model={cfg.model.get('name')} was "
                        "given: a run's adapter answers on its own base; drop model= (or give ckpt=<an adapter folder "
                        "of the run's checkpoints> to load its adapter on another base)")
    if model.get("trust_remote_code") and not cfg.model.get("trust_remote_code"):
        raise UserError(f"{where} sets model.trust_remote_code=true: remote code runs only when asked for on the "
                        "command line (add model.trust_remote_code=true if you trust this run's model folder)")
    return OmegaConf.create(model)


def _check_run_data(run_dir: Path, run_cfg: DictConfig) -> None:
    """A run directory's config is data from disk: only our DataModule may be built from it."""
    target = OmegaConf.select(run_cfg, "data._target_")
    if target != DATAMODULE:
        raise UserError(
            f"{run_dir}/.hydra/config.yaml names data._target_={target}, not {DATAMODULE}: "
            "evaluate only run directories written by llasmol.train"
        )


# The fields of adapter_config.json this code and PEFT's LoRA read, with the JSON types they must have (a
# string rank or a numeric base name fails deep inside PEFT or pathlib otherwise).
_CONFIG_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "peft_type": ((str,), "a string such as \"LORA\""),
    "base_model_name_or_path": ((str, type(None)), "a model id or folder"),
    "r": ((int,), "a whole number (the LoRA rank)"),
    "lora_alpha": ((int, float), "a number"),
    "lora_dropout": ((int, float), "a number"),
    "target_modules": ((list, str, type(None)), "a list of module names"),
    "modules_to_save": ((list, type(None)), "a list of module names or null"),
    "fan_in_fan_out": ((bool,), "true or false"),
    "bias": ((str,), "a string such as \"none\""),
}


def adapter_config(adapter: Path, given: str = "") -> dict:
    """An adapter folder's adapter_config.json as a JSON object; a file that is cut, not JSON or not an object is one
    line naming it (`given`: the setting that named the adapter, e.g. init_from)."""
    path = adapter / ADAPTER_CONFIG
    problem = unreadable(path)
    if problem:
        raise UserError(f"{path} {problem}: {given + ' names ' if given else ''}an adapter folder without its config; "
                        "copy the adapter folder whole")
    return read_json(path, "the file is cut or overwritten; save the adapter again (or give another checkpoint)",
                     dict, "the object PEFT writes")


def _check_adapter_base(adapter: Path, model_cfg: DictConfig) -> None:
    """A readable adapter folder, trained on this base: an adapter of one Hub base model must not be
    loaded onto another (PEFT would load matching shapes silently or fail deep inside)."""
    config = adapter_config(adapter)
    if "peft_type" not in config:
        raise UserError(f"{adapter}/adapter_config.json is not a PEFT adapter config (no peft_type): save the adapter again")
    for field, (kinds, expected) in _CONFIG_FIELDS.items():
        value = config.get(field)
        if field in config and not (isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)):
            raise UserError(f"{adapter}/adapter_config.json: {field} is {json.dumps(value)[:80]}, not {expected}: "
                            "save the adapter again")
    problems = {name: unreadable(adapter / name) for name in (WEIGHTS_SAFETENSORS, WEIGHTS_PICKLE)}
    if all(problems.values()):
        problem = problems[WEIGHTS_SAFETENSORS]
        if problem == "does not exist":
            raise UserError(f"{adapter} has {ADAPTER_CONFIG} but no {WEIGHTS_SAFETENSORS}: copy the weights too")
        raise UserError(f"{adapter / WEIGHTS_SAFETENSORS} {problem}: an adapter's weights are read from a regular file; "
                        "copy the weights again")
    base = config.get("base_model_name_or_path")
    tiny = TINY_BASE.fullmatch(base) if isinstance(base, str) else None
    if tiny:
        if not model_cfg.get("random_init"):
            now = "the pretrained demo base" if is_demo_base(model_cfg) else model_cfg.get("hf_id")
            raise UserError(f"adapter {adapter} was trained on the tiny model's random weights ({base}), but "
                            f"model={model_cfg.get('name')} is {now}: pass model=tiny model.random_init=true")
        # Random weights of equal shapes load any adapter of them without a word, and answer noise.
        arch, seed = tiny["arch"], tiny["seed"]
        if seed is not None and (arch, int(seed)) != (model_cfg.get("arch"), model_cfg.get("init_seed")):
            raise UserError(f"adapter {adapter} was trained on {base}, but this model is {model_cfg.get('arch')} from "
                            f"model.init_seed={model_cfg.get('init_seed')}: pass model.arch={arch} model.init_seed={seed}")
        return
    demo = DEMO_BASE.fullmatch(base) if isinstance(base, str) else None
    if demo:
        if not is_demo_base(model_cfg):
            now = ("the tiny model's random weights (model.random_init=true)" if model_cfg.get("random_init")
                   else model_cfg.get("hf_id"))
            raise UserError(f"adapter {adapter} was trained on the pretrained demo base, but model="
                            f"{model_cfg.get('name')} is {now}: pass model=tiny"
                            + (" without model.random_init=true" if model_cfg.get("random_init") else ""))
        here = demo_weights_digest(model_cfg.path)
        if here != demo["digest"]:  # equal shapes load without a word, on other weights
            raise UserError(f"adapter {adapter} was trained on the demo base whose weights' sha256 begins "
                            f"{demo['digest']}, but model.path={model_cfg.path} holds weights beginning {here}: point "
                            "model.path at the base it was trained on (another llasmol release ships other weights)")
        return
    local_base = model_cfg.get("path") and not is_demo_base(model_cfg)  # the demo base's folder is no user's base
    if not base or local_base or Path(base).is_absolute() or base.startswith(".") or Path(base).exists():
        return  # trained from a local folder: nothing to compare against
    if base == model_cfg.get("hf_id"):
        return
    names = [f.stem for f in sorted((CONFIG_DIR / "model").glob("*.yaml"))
             if OmegaConf.to_container(OmegaConf.load(f), resolve=False).get("hf_id") == base]  # model=hf: ${.name}
    fix = f"model={names[0]}" if names else f"model.hf_id={base} with a model config of its architecture"
    raise UserError(
        f"adapter {adapter} was trained on {base}, but model={model_cfg.get('name')} is "
        f"{model_cfg.get('hf_id') or 'the demo base'}: pass {fix}"
    )


def _best_checkpoint(result: Path) -> tuple[Optional[str], str]:
    """The `best_checkpoint` a run's result.json names (None: none kept) and what it was best by (`best_by`:
    val/reward for a GRPO run; val/loss, also for a run from before the field), read as data: a file that is
    not a JSON object, or a field that is not a path, is one line naming them."""
    fix = "repair or remove it (then the run's last adapter is taken)"
    data = read_json(result, fix, dict, "the object llasmol.train writes")
    best = data.get("best_checkpoint")
    if best is not None and not isinstance(best, str):
        raise UserError(f"{result}: best_checkpoint is {json.dumps(best)[:80]}, not a checkpoint path: {fix}")
    by = data.get("best_by")
    return best, by if isinstance(by, str) else "val/loss"


def _best_adapter(run_dir: Path) -> Path:
    result = run_dir / layout.RESULT
    candidates, by = [], "val/loss"
    if result.is_file():
        best, by = _best_checkpoint(result)
        if best:  # by name: a run directory copied or moved elsewhere keeps its best checkpoint
            candidates.append(adapter_dir(run_dir / layout.CHECKPOINTS / Path(best).name))
    candidates.append(adapter_dir(run_dir / layout.CHECKPOINTS / layout.LAST_CKPT))
    for i, candidate in enumerate(map(readable_adapter, candidates)):
        if (candidate / ADAPTER_CONFIG).is_file():
            if len(candidates) == 1:
                why = "the last: the run names no best one"
            else:
                why = f"the best by {by}" if i == 0 else f"the last: the best one, {candidates[0]}, is gone"
            log.info("adapter: %s (%s; pass ckpt=<adapter folder> for another)", candidate, why)
            return candidate
    raise UserError(f"run directory {run_dir} has no adapter checkpoint yet (looked for {candidates[-1]})")


def pick_device(name: str):
    """`device=auto`: the GPU when there is one, else the CPU; any other value as given (cuda:1, cpu)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)  # a name the schema allows
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise UserError(f"device={name} but torch sees {torch.cuda.device_count()} CUDA GPU(s) on this machine: use "
                        "device=auto (the GPU when there is one) or device=cpu")
    return device


def load_model(model_cfg: DictConfig, adapter: Optional[str], quant_cfg: Optional[DictConfig] = None,
               merge: bool = False):
    """(model in eval mode, tokenizer): the base (quantised by `quant_cfg`) with the adapter loaded on top.

    `merge`: fold the adapter into the base weights (PEFT's `merge_and_unload`), as the official evaluation
    does (LLM4Chem `model.py` merges the LoRA weights into the bf16 base before generating): the same
    function, without the adapters' extra matmuls at every step. A quantised base keeps its adapter
    separate: merging would re-round the 4/8-bit weights.
    """
    # lazy: the base's loader brings torch and transformers (1.7 s), which evaluate's checks before Hydra need not
    from llasmol.model.base import load_base_model, load_tokenizer

    tokenizer = load_tokenizer(model_cfg)
    model = load_base_model(model_cfg, tokenizer, quant_cfg)
    if adapter:
        folder = Path(adapter) if Path(adapter).is_dir() else _fetch_adapter(adapter, model_cfg)
        model = load_adapter(model, folder)
        if merge and quant_cfg is not None and quant_cfg.get("bits"):
            log.info("adapter kept separate on the %s-bit base (merging would re-round its weights)", quant_cfg.bits)
        elif merge:
            model = model.merge_and_unload()
    return model.eval(), tokenizer


def _fetch_adapter(repo_id: str, model_cfg: DictConfig) -> Path:
    """A Hub adapter's files, fetched into the Hugging Face cache (or found there offline): its config and
    weights only, so that its pickle, if it has one, is read by our weights-only reader, not by PEFT."""
    from huggingface_hub import snapshot_download

    reason = offline.hub_unreachable()
    if reason is not None and not offline.cached_on_disk(repo_id, ADAPTER_CONFIG):
        raise UserError(f"adapter {repo_id} is not available offline ({reason}): run `hf download {repo_id}` where "
                        "the Hub is reachable, or give ckpt=<local adapter folder>")
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=[ADAPTER_CONFIG, WEIGHTS_SAFETENSORS, WEIGHTS_PICKLE],
                                        local_files_only=reason is not None))
    except Exception as err:  # unknown repo, gated, a failed download: the same for the user
        raise UserError(f"cannot fetch adapter {repo_id} from the Hugging Face Hub ({type(err).__name__}): "
                        "check ckpt=, or give a local adapter folder") from None
    _check_adapter_base(folder, model_cfg)
    return folder
