"""Helpers shared by the benchmarks: offline settings, the composed default config, result files."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

from llasmol.core.config import CONFIG_DIR, compose_config  # noqa: E402,F401  (after the offline settings above)


def _paper_setting(group_file: str, key: str):
    """A value as conf/ states it (its one home), read without composing: the paper's seed and token length."""
    from omegaconf import OmegaConf

    return OmegaConf.load(CONFIG_DIR / group_file)[key]


SEED = _paper_setting("shared.yaml", "seed")
MAX_LENGTH = _paper_setting("data/smolinstruct.yaml", "max_length")


def machine() -> dict:
    return {"nproc": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]}


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"result written to {path}")
    return path


def mistral_tokenizer_folder(root: Path, legacy: bool = True) -> Path:
    """A model folder with Mistral-7B's real SentencePiece tokenizer, laid out as the Hub has it (weights
    aside): the model file ships inside the `mistral_common` wheel, so nothing is downloaded."""
    import shutil

    import mistral_common

    from llasmol.model.base import ARCH_DIR  # lazy: imports torch (2-3 s); every benchmark imports this module

    folder = Path(root) / f"mistral-7b-tokenizer-legacy-{legacy}"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1", folder / "tokenizer.model")
    shutil.copy(ARCH_DIR / "mistral-7b.json", folder / "config.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": legacy,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
    }))
    return folder


# Real tokenizers of current Mistral bases that ship inside the `mistral_common` wheel (`data/`), by the
# `model=` they belong to: (file in the wheel, name the Hub gives it, bundled arch). `load_tokenizer`
# reads them from a `model.path` folder as it would read the Hub's files.
WHEEL_TOKENIZERS = {
    "mistral_v03": ("mistral_instruct_tokenizer_240323.model.v3", "tokenizer.model", "mistral-7b-v0.3"),
    "mistral_nemo": ("tekken_240718.json", "tekken.json", "mistral-nemo-12b"),
}


def wheel_tokenizer_folder(root: Path, model: str) -> Path:
    """A model folder (weights aside) holding the real tokenizer of `model` (a key of WHEEL_TOKENIZERS)."""
    import shutil

    import mistral_common

    from llasmol.model.base import ARCH_DIR  # lazy: as above

    source, name, arch = WHEEL_TOKENIZERS[model]
    folder = Path(root) / f"{model}-tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(mistral_common.__file__).parent / "data" / source, folder / name)
    shutil.copy(ARCH_DIR / f"{arch}.json", folder / "config.json")
    if name == "tokenizer.model":  # SentencePiece: the Hub's tokenizer_config.json names its specials
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": False,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
        }))
    return folder
