"""`llasmol <command> [arguments]`: every command under one name; `llasmol --help` lists them.

`llasmol train model=mistral lora=full` runs exactly what `python -m llasmol.train model=mistral lora=full` runs
(the module as `__main__`, its arguments as they are: Hydra overrides, `--multirun`, `--help`), so both spellings
stay the same command. Each command's line in the list is the first line of its module's docstring, read from
the file (nothing is imported to list them).
"""

from __future__ import annotations

import ast
import difflib
import runpy
import sys
from pathlib import Path
from typing import Optional, Sequence

# command -> module; in the order a newcomer meets them
COMMANDS: dict[str, str] = {
    "train": "llasmol.train",
    "evaluate": "llasmol.evaluate",
    "generate": "llasmol.generate",
    "report": "llasmol.report",
    "baseline": "llasmol.baseline",
    "audit": "llasmol.audit",
    "params": "llasmol.params",
    "export": "llasmol.export",
    "convert-adapter": "llasmol.convert_adapter",
}


def summary(module: str) -> str:
    """The first line of `module`'s docstring, without its leading `python -m ...` usage."""
    path = Path(__file__).parent / (module.split(".", 1)[1] + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    if line.startswith("`python -m") and "`: " in line:
        line = line.split("`: ", 1)[1]
    return line[:1].upper() + line[1:]


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {summary(module)}" for name, module in COMMANDS.items())
    return ("usage: llasmol <command> [arguments]   (the same as python -m llasmol.<command> [arguments])\n\n"
            f"commands:\n{rows}\n\n`llasmol <command> --help` shows a command's own options.")


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        raise SystemExit(0 if args else 2)
    name, rest = args[0], args[1:]
    module = COMMANDS.get(name) or COMMANDS.get(name.replace("_", "-"))
    if module is None:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        print(f"error: llasmol has no command {name!r}: {hint}the commands are {', '.join(COMMANDS)} "
              "(llasmol --help)", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = [sys.argv[0], *rest]  # as `python -m` gives them (runpy puts the module's file first)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
