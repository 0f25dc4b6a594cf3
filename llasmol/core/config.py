"""Hydra/OmegaConf glue shared by the commands and the tests."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf

from llasmol.core.errors import UserError, report_user_errors
from llasmol.core.schema import check_config

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _config_dir() -> Path:
    """Where the configs are: `conf/` at the top of a checkout, beside `llasmol/` (an editable install, or the
    checkout on PYTHONPATH); in an installed wheel they ship as the package `llasmol.conf` (setup.py's
    package-dir maps one to the other), so a plain `pip install .` finds them too."""
    installed = PACKAGE_DIR / "conf"
    return installed if installed.is_dir() else PACKAGE_DIR.parent / "conf"


CONFIG_DIR = _config_dir()


def _sweep_group() -> str | None:
    """The W&B group of a multirun job: the sweep folder's name, shared by all its jobs; None otherwise."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return f"{HydraConfig.get().job.name}-{Path(HydraConfig.get().sweep.dir).name}"


def _interactive() -> bool:
    return sys.stdout.isatty()


RESOLVERS = {
    # `${llasmol_asset:data/bundled}`: a path inside the installed package.
    "llasmol_asset": lambda rel: str(PACKAGE_DIR / rel),
    # W&B stays offline (no account, no network) unless the user asks for online, by config or WANDB_MODE.
    "llasmol_wandb_offline": lambda: os.environ.get("WANDB_MODE", "offline") != "online",
    "llasmol_sweep_group": _sweep_group,
    # Progress bars only on a terminal; logs and CI stay quiet.
    "llasmol_interactive": _interactive,
    # The GPU presets' precision: bf16 autocast on GPUs, plain fp32 when run on CPU.
    "llasmol_precision": lambda accelerator: "32-true" if accelerator == "cpu" else "bf16-mixed",
    # A quantised base's optimizer: paged 8-bit AdamW on GPUs (QLoRA's: its state pages out to CPU memory
    # under a memory spike), the same 8-bit AdamW unpaged on a CPU, where there is nothing to page to.
    "llasmol_kbit_optimizer": lambda accelerator: "bitsandbytes.optim." + (
        "AdamW8bit" if accelerator == "cpu" else "PagedAdamW8bit"),
}


def register_resolvers() -> None:
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()


def compose_config(overrides: list[str] | None = None, config_name: str = "train"):
    """The config a command line with these overrides would get (without Hydra's run folder); for tests,
    benchmarks and notebooks."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))


class SweepSummary(Callback):
    """A Hydra callback: once every job of a multirun of `train` has ended, print the sweep folder and the
    command that compares its variants (the jobs' own output scrolled past long before)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        if config.get("task_name") in ("train", "baseline"):
            sweep = Path(config.hydra.sweep.dir).resolve()
            print(f"sweep folder: {sweep}\n  compare its variants: python -m llasmol.report {sweep}", flush=True)


# Hydra's command-line options that take the next argument as their value (it is not an override);
# --info takes one only optionally (`--info config`).
VALUED_OPTIONS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                  "--config-dir", "-cd", "--experimental-rerun"}
OPTIONAL_VALUE_OPTIONS = {"--info", "-i"}


def overrides_of(argv: list[str]) -> list[str]:
    """The key=value arguments of a command line (its options and their values left out)."""
    out = []
    for i, arg in enumerate(argv):
        before = argv[i - 1] if i else ""
        if arg.startswith("-") or before in VALUED_OPTIONS or (before in OPTIONAL_VALUE_OPTIONS and "=" not in arg):
            continue
        out.append(arg)
    return out


def _quoted(value: str) -> str:
    return value if re.fullmatch(r"[\w./:@-]*", value) else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_overrides(config_name: str, overrides: list[str], check: Optional[Callable] = None) -> None:
    """A mistyped choice (model=mistrall) or setting (trainer.max_stepz=1) as one `UserError`, before Hydra
    starts: Hydra's own message is a dozen lines and exits with status 1, after a multirun's first jobs
    may have run. Each value of a sweep (lora=lite,fulll) is checked, and so is every setting of the command's
    schema (`llasmol.core.schema`: types, bounds, interpolations that cannot resolve, lora=large model=mistral),
    before Hydra writes the run folder's config; `check`, when given, is called with
    each composed config to name a bad value of a plain setting (a baseline's method=rdkt)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as err:
        bad = str(err).split("\n", 1)[0].removeprefix("Error parsing override ")
        raise UserError(f"cannot read the argument {bad}: settings are key=value (quote values with spaces "
                        "or commas: key='a b')") from None
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    trials = [plain]
    for override in parsed:
        if override.is_sweep_override():
            try:
                values = list(override.sweep_string_iterator())
            except Exception:  # glob()/interval() sweeps: Hydra checks them itself
                continue
            trials += [plain + [f"{override.get_key_element()}={_quoted(v)}"] for v in values]
    for trial in trials:
        try:
            cfg = compose_config(trial, config_name)
            check_config(cfg)
            if check is not None:
                check(cfg)
        except HydraException as err:
            raise UserError(_one_line(str(err), config_name)) from None
        finally:
                    GlobalHydra.instance().clear()


def _one_line(message: str, config_name: str) -> str:
    """Hydra's composition errors, said in one line with the fix."""
    missing = re.search(r"Could not find '([^']+)/([^'/]+)'", message)
    if missing:
        group, choice = missing.groups()
        options = re.findall(r"^\t(\S+)$", message.split("Config search path")[0], flags=re.M)
        listed = ", ".join(options) if options else f"see conf/{group}/"
        return f"{group}={choice} is not a choice of {group}: pick one of {listed}"
    unknown = re.search(r"Could not override '([^']+)'", message)
    if unknown:
        key = unknown.group(1)
        return (f"{key} is not a setting of llasmol.{config_name}: check the spelling (python -m "
                f"llasmol.{config_name} --cfg job lists them), or add a new key with +{key}=...")
    return message.strip().splitlines()[0]


def named_run_dir(argv: list[str]) -> Path | None:
    """The folder a command line names for its run (`hydra.run.dir=`, or a sweep's `hydra.sweep.dir=`)."""
    named = [a.split("=", 1)[1] for a in argv
             if a.lstrip("+").startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
    return Path(named[-1]) if named else None


def command_line_values(argv: list[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """The values a command line gives the top-level settings in `defaults` (the last one wins; a sweep of
    several values counts as given, as a list), else their defaults. Read before Hydra starts."""

    values = dict(defaults)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides_of(argv))
    except Exception:  # check_overrides has said what is wrong with the line
        return values
    for override in parsed:
        key = override.get_key_element().lstrip("+")
        if key in values and not override.is_delete():
            values[key] = override.value()
    return values


# Hydra writes the run's config and log (tens of KB) before any of our code runs, and its own error on a full disk
# is a traceback: below this much free space the run folder is refused up front.
MIN_FREE_BYTES = 256 << 10


def check_writable(folder: Path) -> None:
    """A `UserError` when `folder` (or, while it does not exist yet, the nearest folder above it) cannot
    be written: a read-only file system, a folder the user may not write to, or a full disk or quota."""

    existing = Path(os.path.abspath(folder))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        raise UserError(f"{existing} {why}, so the run folder {folder} cannot be written there: give the run a "
                        "writable folder with hydra.run.dir=<folder> (or run from a writable directory)")
    stats = os.statvfs(existing)
    # f_bavail: what an unprivileged writer may use; a quota shows as the same shortage when it is enforced here.
    free = min(shutil.disk_usage(existing).free, stats.f_bavail * stats.f_frsize)
    if free < MIN_FREE_BYTES:
        raise UserError(f"cannot write the run folder {folder}: no space left on device ({free / 1e9:.2f} GB free "
                        "there); free space there (old runs' checkpoints/) or write the run elsewhere with "
                        "hydra.run.dir=...")


def check_command_line(config_name: str, run_folder: bool = False, check: Optional[Callable] = None) -> None:
    """`check_overrides` for this process's command line; one `error:` line and exit status 2 on a mistake.
    `run_folder`: the command writes a run folder, which must be writable (checked before Hydra writes);
    `check`: the command's own check of each composed config (see `check_overrides`)."""
    report_user_errors(check_overrides)(config_name, overrides_of(sys.argv[1:]), check)
    if run_folder:
        report_user_errors(check_writable)(named_run_dir(sys.argv[1:]) or Path("outputs"))
