"""Hydra/OmegaConf glue shared by the commands and the tests."""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shlex
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

from llasmol.core.errors import UserError, remove_empty_parents, report_user_errors
from llasmol.core.run_dir import CHECKPOINTS, RESUME_CKPTS
from llasmol.core.files import NO_SPACE, folder_problem, nearest_existing
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


# GPUs per node a SLURM job asks for when trainer.devices is `auto` (or -1): the paper's 4 × A100.
SLURM_GPUS_PER_NODE = 4


def _device_count(devices, auto: int) -> int:
    """How many devices `trainer.devices` names: a count, a list of ids or `"0,1"` as Lightning reads them;
    `auto` for `auto`/-1 (every device there is, known only once Lightning looks), and for a count the schema
    refuses (0, no ids), so that its message names trainer.devices rather than what was derived from it."""
    count = 0
    if isinstance(devices, int) and not isinstance(devices, bool):
        count = devices
    elif isinstance(devices, str) and devices.strip().isdigit():
        count = int(devices)
    elif isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    elif isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        count = len(devices)
    return count if count > 0 else auto


def _gpus_per_node(devices) -> int:
    """A SLURM job's GPUs per node for `trainer.devices` (`auto`: every GPU SLURM gives, `SLURM_GPUS_PER_NODE`)."""
    return _device_count(devices, SLURM_GPUS_PER_NODE)


def _per_process_batch(samples: int, devices, nodes) -> int:
    """An effective batch of `samples` per process: the demo's, so that `trainer.devices=2` runs as it is
    (with `auto`, one process is assumed)."""
    return int(samples) * _device_count(devices, 1) * int(nodes)


def _not_given(key: str, example: str):
    """A setting a config option cannot do without: `???` would not do, as a `???` merged over a value keeps
    that value (data=custom's path over SMolInstruct's null, which downloads the archive)."""
    raise UserError(f"{key} is not set: give it a value, {key}={example}")


def wandb_mode(given: str) -> str:
    """WANDB_MODE as W&B spells it (lower case, no spaces), whatever spelling the user wrote."""
    return given.strip().lower()


RESOLVERS = {
    # `${llasmol_asset:data/bundled}`: a path inside the installed package.
    "llasmol_asset": lambda rel: str(PACKAGE_DIR / rel),
    # `${llasmol_required:data.path,<file.csv>}`: a setting the user must give.
    "llasmol_required": _not_given,
    # W&B stays offline (no account, no network) unless the user asks for online, by config or WANDB_MODE.
    "llasmol_wandb_offline": lambda: wandb_mode(os.environ.get("WANDB_MODE", "offline")) != "online",
    "llasmol_sweep_group": _sweep_group,
    # A multirun job's folder number: its place in this sweep plus `first_job`, so that a continued sweep
    # (the jobs a stopped one had not started) numbers on from the jobs its folder has.
    "llasmol_job_number": lambda num, first: int(num) + int(first),
    # Progress bars only on a terminal; logs and CI stay quiet.
    "llasmol_interactive": _interactive,
    # The GPU presets' precision: bf16 autocast on GPUs, plain fp32 when run on CPU.
    "llasmol_precision": lambda accelerator: "32-true" if accelerator == "cpu" else "bf16-mixed",
    "llasmol_gpus_per_node": _gpus_per_node,
    "llasmol_per_process_batch": _per_process_batch,
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
    """A Hydra callback for multiruns of `train` and `baseline`: once every job has ended, print the sweep folder
    and the command that compares its variants (the jobs' own output scrolled past long before). When the
    multirun stops before its end (Ctrl-C, SIGTERM, a job's error: Hydra then calls no end hook, so this is
    said as the process exits), say how to continue the stopped job (`ckpt_path=last`; a baseline's is run
    again with the rest) and the command that runs the jobs that had not started, into the same folder. The
    jobs' own log lines go to their train.log only, so this is where a user sees it."""

    def __init__(self) -> None:
        self._sweep: Optional[dict] = None  # what a stopped multirun needs to say how to continue

    def on_multirun_start(self, config, **kwargs) -> None:
        # Only Hydra's basic launcher runs the jobs one after another in this process, where a stop leaves the
        # later ones unstarted (submitit's start in their own processes, where these hooks are not called).
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_") or "")
        if config.get("task_name") not in ("train", "baseline") or not launcher.endswith("BasicLauncher"):
            return
        self._sweep = {"task": config.task_name, "dir": str(Path(str(config.hydra.sweep.dir)).resolve()),
                       "overrides": list(config.hydra.overrides.task), "first_job": int(config.get("first_job") or 0),
                       "started": -1, "job": None, "job_ended": False, "ended": False}
        atexit.register(self._said_if_stopped)

    def on_job_start(self, config, **kwargs) -> None:
        if self._sweep is not None:
            self._sweep.update(started=int(config.hydra.job.num), job_ended=False, job={
                "dir": str(OmegaConf.select(config, "hydra.runtime.output_dir") or ""),
                "overrides": list(config.hydra.overrides.task)})

    def on_job_end(self, config, **kwargs) -> None:
        if self._sweep is not None:
            self._sweep["job_ended"] = True

    def on_multirun_end(self, config, **kwargs) -> None:
        if self._sweep is not None:
            self._sweep["ended"] = True
        if config.get("task_name") in ("train", "baseline"):
            sweep = Path(config.hydra.sweep.dir).resolve()
            print(f"sweep folder: {sweep}\n  compare its variants: python -m llasmol.report {sweep}", flush=True)

    def _said_if_stopped(self) -> None:
        sweep, self._sweep = self._sweep, None
        if sweep is None or sweep["ended"]:
            return
        lines, done = [], sweep["started"]
        job = sweep["job"]
        if job and not sweep["job_ended"]:
            resumable = any((Path(job["dir"]) / CHECKPOINTS / name).is_file() for name in RESUME_CKPTS)
            if sweep["task"] == "train" and resumable:  # a training job resumes from its checkpoint, in its folder
                given = _as_given(sweep["overrides"])
                args = "".join(shlex.quote(given.get(o.split("=", 1)[0], o)) + " " for o in job["overrides"]
                               if not o.startswith("first_job="))
                lines.append(f"continue it with: python -m llasmol.train {args}"
                             f"hydra.run.dir={shlex.quote(job['dir'])} ckpt_path=last")
            else:  # it kept nothing (a baseline's, or one that stopped before its first checkpoint): it runs again
                done -= 1
        folder = Path(sweep["dir"])
        if done < 0 and folder.is_dir() and all(p.name == "multirun.yaml" for p in folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)  # no job kept anything: no folder of Hydra's notes alone
            remove_empty_parents(folder)
            again = " ".join(shlex.quote(o) for o in sweep["overrides"] if not o.startswith("first_job="))
            print(f"({folder} held only multirun.yaml, and was removed: nothing was kept)\n  run the sweep again "
                  f"with: python -m llasmol.{sweep['task']} --multirun {again}", file=sys.stderr, flush=True)
            return
        rest = remaining_jobs_command(sweep["task"], sweep["overrides"], done, sweep["dir"], sweep["first_job"])
        if rest:
            lines.append(f"the jobs that had not {'started' if done == sweep['started'] else 'finished'} run into "
                         f"the same folder with: {rest}")
        if lines:
            where = "after" if job and sweep["job_ended"] else "in"  # between two jobs: after the one that ended
            print(f"multirun stopped {where} job {sweep['first_job'] + max(sweep['started'], 0)}",
                  *(f"  {line}" for line in lines), sep="\n", file=sys.stderr, flush=True)


def sweep_jobs(overrides: list[str], leave_out: tuple[str, ...] = ()) -> list[list[str]]:
    """Each job of a multirun as its `key=value` overrides, in Hydra's basic sweeper's order (the product of each
    key's values, keys in the order given, a key given twice in its first place with its last values); the keys in
    `leave_out` are not in them."""
    values: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        if key.lstrip("+") not in leave_out:
            options = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            values[key] = [f"{key}={v}" for v in options]
    return [list(job) for job in itertools.product(*values.values())]


def preview_sweep(name: str, argv: list[str]) -> None:
    """`--multirun --cfg job`, which Hydra refuses (it takes one of the two): each job's composed config, as
    `--cfg job` prints one run's, headed by its number and overrides, so a sweep (a SLURM one too) can be read before
    it is launched."""
    flag = "--cfg" if "--cfg" in argv else "-c"
    which = argv[argv.index(flag) + 1] if argv.index(flag) + 1 < len(argv) else ""
    if which != "job":
        raise UserError(f"--multirun with {flag} {which or '(nothing)'}: a sweep is previewed job by job with --cfg job "
                        "(Hydra's own settings are one run's: --cfg hydra without --multirun)")
    for number, job in enumerate(sweep_jobs(overrides_of(argv), leave_out=("hydra.sweep.dir",))):
        print(f"# job {number}: {' '.join(job) or '(the defaults)'}")
        print(OmegaConf.to_yaml(compose_config(job, name)), flush=True)


def remaining_jobs_command(task: str, overrides: list[str], done: int, sweep_dir: str, first_job: int = 0) -> str:
    """The command line (one, or a few joined by `&&` when the remaining jobs are not one product of values)
    that runs the jobs of a multirun after the `done`-th (0-based; -1: none), numbered on from it in
    `sweep_dir`; "" when none remain. Jobs are the product of the sweep's values in Hydra's basic sweeper's
    order (the product of each key's values, keys in the order given, a key given twice in its first place with its
    last values); a setting that is not swept is written as it was given."""
    given = _as_given(overrides)
    todo = sweep_jobs(overrides, leave_out=("hydra.sweep.dir", "first_job"))[done + 1:]  # those two: said anew below
    commands, number = [], first_job + done + 1
    for group in _products(todo):
        said = [given.get(o.split("=", 1)[0], o) for o in group["overrides"]]
        args = "".join(shlex.quote(o) + " " for o in said)  # as a shell reads them: {a:1} would expand
        commands.append(f"python -m llasmol.{task} --multirun {args}hydra.sweep.dir={shlex.quote(sweep_dir)} "
                        f"first_job={number}")
        number += group["jobs"]
    return " && ".join(commands)


def _as_given(overrides: list[str]) -> dict[str, str]:
    """The settings of a command line that are not swept, by key, as typed (Hydra's job overrides say
    `False` for `false`, `0.0001` for `1e-4`)."""
    return {o.get_key_element(): o.input_line for o in OverridesParser.create().parse_overrides(overrides)
            if not o.is_sweep_override()}


def _products(jobs: list[list[str]]) -> list[dict]:
    """`jobs` (each a list of `key=value`, the same keys in the same order) as few sweeps as possible, in
    order: each `{"overrides": [key=v1,v2, ...], "jobs": n}` one product of values."""
    if not jobs:
        return []
    pairs = [[o.split("=", 1) for o in job] for job in jobs]
    values = [list(dict.fromkeys(job[i][1] for job in pairs)) for i in range(len(pairs[0]))]
    count = 1
    for options in values:
        count *= len(options)
    if count == len(jobs):  # a suffix of a product in the sweeper's order that is a whole product: it is one
        # Each value is already as an override writes it (Hydra's sweep_string_iterator: a dict {a:1}, a
        # quoted string 'x y'), so the values joined with commas are the sweep again.
        overrides = [job_pair[0] + "=" + ",".join(options) for job_pair, options in zip(pairs[0], values)]
        return [{"overrides": overrides, "jobs": len(jobs)}]
    varying = next(i for i, options in enumerate(values) if len(options) > 1)
    head = [job for job in jobs if job[varying] == jobs[0][varying]]
    return _products(head) + _products(jobs[len(head):])


# Hydra's command-line options that take the next argument as their value (it is not an override);
# --info takes one only optionally (`--info config`).
VALUED_OPTIONS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                  "--config-dir", "-cd", "--experimental-rerun"}
OPTIONAL_VALUE_OPTIONS = {"--info", "-i"}


_OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*=")


def _settings_of(config_name: str) -> frozenset[str]:
    """The names an override of command `config_name` may start with: its config's top-level keys and the groups."""
    try:
        keys = set(compose_config([], config_name))
    finally:
        GlobalHydra.instance().clear()
    return frozenset(keys | {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()} | {"hydra"})


NO_QUERY = 'no query: run python -m llasmol.generate "<your question>" [ckpt=<run dir>]'


def split_free_text(argv: list[str], key: str, config_name: str,
                    settings: Optional[frozenset[str]] = None) -> tuple[list[str], Optional[str]]:
    """`argv` without its free text, and that text (generate's question): Hydra takes only key=value overrides, and
    the text is kept out of them so that it is never parsed as config (`${oc.env:HOME}` in a question stays as
    written). It is `<key>=<text>` when given (taken literally, whatever it holds), else the first argument that is
    not an option or an override of one of the command's settings: `'a=b, c'` is text, since `a` is no setting."""
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith(f"{key}="):
            return argv[:i] + argv[i + 1 :], arg[len(key) + 1 :]
    settings = _settings_of(config_name) if settings is None else settings
    for i, arg in enumerate(argv[1:], 1):
        if argv[i - 1] in VALUED_OPTIONS or arg.startswith("-"):
            continue
        name = re.split(r"[.=/@]", arg.lstrip("+~"), maxsplit=1)[0]
        if not (_OVERRIDE.match(arg) and (name in settings or arg[0] in "+~")):  # +key=: a key added on purpose
            return argv[:i] + argv[i + 1 :], arg
    return argv, None


def overrides_of(argv: list[str]) -> list[str]:
    """The key=value arguments of a command line (its options and their values left out)."""
    out = []
    for i, arg in enumerate(argv):
        before = argv[i - 1] if i else ""
        if arg.startswith("-") or before in VALUED_OPTIONS or (before in OPTIONAL_VALUE_OPTIONS and "=" not in arg):
            continue
        out.append(arg)
    return out


def check_overrides(config_name: str, overrides: list[str], check: Optional[Callable] = None) -> None:
    """A mistyped choice (model=mistrall) or setting (trainer.max_stepz=1) as one `UserError`, before Hydra
    starts: Hydra's own message is a dozen lines and exits with status 1, after a multirun's first jobs
    may have run. Each value of a sweep (lora=lite,fulll) is checked, and so is every setting of the command's
    schema (`llasmol.core.schema`: types, bounds, interpolations that cannot resolve, lora=large model=mistral),
    before Hydra writes the run folder's config; `check`, when given, is called with
    each composed config to name a bad value of a plain setting (a baseline's method=rdkt)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as err:  # its first line names the argument only for some mistakes: name it here
        value = str(err.override).split("=", 1)[1] if "=" in str(err.override) else ""
        if value.startswith("~"):  # the shell leaves a ~ after '=' as it is, and Hydra's grammar reads no ~ there
            raise UserError(f"cannot read the argument '{err.override}': a path starting with ~ is not expanded "
                            f"there; give it whole, e.g. {str(err.override).split('=', 1)[0]}=$HOME{value[1:]}") from None
        raise UserError(f"cannot read the argument '{err.override}': settings are key=value (quote values with "
                        "spaces or commas: key='a b')") from None
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    trials = [plain]
    for override in parsed:
        if override.is_sweep_override():
            try:
                values = list(override.sweep_string_iterator())
            except Exception:  # glob()/interval() sweeps: Hydra checks them itself
                continue
            # each value as an override writes it ({a:1}, 'x y'): given as such, it is that one value
            trials += [plain + [f"{override.get_key_element()}={v}"] for v in values]
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
        owner = _option_with(key)
        if owner:
            return f"{key} is a setting of {owner}, which this command line does not choose: add {owner}"
        return (f"{key} is not a setting of llasmol.{config_name}: check the spelling (python -m "
                f"llasmol.{config_name} --cfg job lists them), or add a new key with +{key}=...")
    merging = re.search(r"Error merging override (\S+?)=(.*)$", message.strip().splitlines()[0] if message.strip() else "")
    if merging:  # a list or value given where the config holds a group of settings (or the reverse)
        key, value = merging.groups()
        return (f"{key}={value} cannot replace {key}, which is a group of settings, not one value: set its settings "
                f"one by one ({key}.<name>=<value>; python -m llasmol.{config_name} --cfg job shows them)")
    lines = message.strip().splitlines()
    return lines[0] if lines else f"the configuration of llasmol.{config_name} cannot be composed"


def _option_with(key: str) -> Optional[str]:
    """The choice that brings setting `key` (`objective.beta`: objective=grpo; `reward.families.x`: the objective
    whose setup brings the reward group), or None when no option of `key`'s group has it."""
    group, _, rest = key.lstrip("+").partition(".")
    options = sorted((CONFIG_DIR / group).glob("*.yaml")) if rest and group.isidentifier() else []
    for path in options:
        if OmegaConf.select(OmegaConf.load(path), rest, default=_MISSING) is not _MISSING:
            for setup in sorted((CONFIG_DIR / "setup").glob("*/*.yaml")):  # a group another choice brings
                if f"/{group}: {path.stem}" in setup.read_text(encoding="utf-8"):
                    return f"{setup.parent.name}={setup.stem}"
            return f"{group}={path.stem}"
    return None


_MISSING = object()


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


def check_writable(folder: Path) -> None:
    """A `UserError` when `folder` (or, while it does not exist yet, the nearest folder above it) cannot
    be written: a read-only or virtual file system, a folder the user may not write to, or a full disk or quota."""

    existing = nearest_existing(folder)
    if not existing.is_dir():  # hydra.run.dir=notes.txt/run: no folder can be made under a file
        raise UserError(f"{existing} is not a folder, so the run folder {folder} cannot be made there: give the run a "
                        "folder with hydra.run.dir=<folder>")
    problem = folder_problem(existing)
    if problem and problem.startswith(NO_SPACE):
        raise UserError(f"cannot write the run folder {folder}: {existing} {problem}; free space there (old runs' "
                        "checkpoints/) or write the run elsewhere with hydra.run.dir=...")
    if problem:
        raise UserError(f"{existing} {problem}, so the run folder {folder} cannot be written there: give the run a "
                        "writable folder with hydra.run.dir=<folder> (or run from a writable directory)")


def check_options(argv: list[str]) -> None:
    """An option quoted together with its value ('--cfg job') is one argument Hydra's parser cannot read (five
    lines, exit status 1): one line here, naming it."""
    for arg in argv:
        if arg.startswith("-") and len(arg.split()) > 1 and arg.split()[0] in {*VALUED_OPTIONS, *OPTIONAL_VALUE_OPTIONS}:
            option, value = arg.split(maxsplit=1)
            raise UserError(f"{arg!r} is one argument: give the option and its value as two ({option} {value}, "
                            "without quotes around both)")


def check_command_line(config_name: str, run_folder: bool = False, check: Optional[Callable] = None) -> None:
    """`check_overrides` for this process's command line; one `error:` line and exit status 2 on a mistake.
    `run_folder`: the command writes a run folder, which must be writable (checked before Hydra writes);
    `check`: the command's own check of each composed config (see `check_overrides`)."""
    report_user_errors(check_options)(sys.argv[1:])
    report_user_errors(check_overrides)(config_name, overrides_of(sys.argv[1:]), check)
    if run_folder:
        report_user_errors(check_writable)(named_run_dir(sys.argv[1:]) or Path("outputs"))
