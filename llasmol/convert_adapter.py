"""`python -m llasmol.convert_adapter <adapter folder>`: the safetensors copy of an adapter saved as `.bin`.

PEFT before 0.7 saved adapters as a pickle, `adapter_model.bin` (Mol-Instructions' Molinst LoRA, early
LlaSMol releases). This reads it with the weights-only reader (tensors only: nothing in the file runs) and
writes `adapter_model.safetensors` beside it, atomically, so later loads need no pickle at all. The `.bin`
stays; once the copy loads it may be deleted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from llasmol.core.errors import UserError, report_user_errors
from llasmol.core.files import write_bytes
from llasmol.model.adapters import ADAPTER_CONFIG, WEIGHTS_PICKLE, WEIGHTS_SAFETENSORS, read_pickled_weights


def convert(folder: str | Path) -> Path:
    """Write `<folder>/adapter_model.safetensors` from its `adapter_model.bin`; returns the new file."""
    from safetensors.torch import save

    folder = Path(folder)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise UserError(f"{folder} is not an adapter folder (no {ADAPTER_CONFIG}): give the folder of the adapter")
    if not (folder / WEIGHTS_PICKLE).is_file():
        raise UserError(f"{folder} has no {WEIGHTS_PICKLE} to convert"
                        + (f" (it has {WEIGHTS_SAFETENSORS} already)" if (folder / WEIGHTS_SAFETENSORS).is_file() else ""))
    weights = read_pickled_weights(folder / WEIGHTS_PICKLE)
    target = folder / WEIGHTS_SAFETENSORS
    write_bytes(target, save(weights, metadata={"format": "pt"}))
    return target


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llasmol.convert_adapter", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the adapter folder (adapter_config.json + adapter_model.bin)")
    args = parser.parse_args(argv)
    target = convert(args.folder)
    print(f"wrote {target}: later loads read it and need no pickle", flush=True)


if __name__ == "__main__":
    main()
