"""`python -m llasmol.audit`: a data-leakage audit of a SMolInstruct copy (the bundled sample by default).

    python -m llasmol.audit                                  # the bundled sample
    python -m llasmol.audit data.path=<SMolInstruct folder>  # a local copy of the full dataset
    python -m llasmol.audit data.path=<folder> held_out=[test] fail_on_duplicates=false

Writes `audit.md` and `audit.json` into its run folder (`outputs/audit/<date>_<time>/`), prints a summary,
and exits 1 when leakage is found, 0 when none, 2 for bad input: a data pipeline can gate on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from llasmol.core.errors import UserError
from llasmol.core.files import write_json, write_text
from llasmol.data.source import SMolInstructSource
from llasmol.frame import command, start


def run_audit(cfg: DictConfig) -> dict:
    """Audit `cfg.data`, write the report into `cfg.paths.output_dir`; the result (`audit.json`'s content)."""
    # lazy: the audit pulls in RDKit, NumPy and the scorer (0.8 s), which `audit --help` and the command-line
    # check before Hydra do not need
    from llasmol.leakage import audit, corpus_overlap, to_markdown

    tasks = start(cfg, torch=False).tasks  # workers=0, examples=-1: one line before any file is read
    source = SMolInstructSource.from_config(cfg.data, table=tasks)
    if source.copy() is None:
        raise UserError(f"audit reads SMolInstruct's layout (raw files, sample lists, split groups); {', '.join(source.places())} "
                        "holds tables of your own, which it does not read: audit a SMolInstruct copy, data.path=<folder> "
                        "with data.also=[] (a table without a split column is split by input, so an input is never in two splits)")
    result = audit(source, held_out=list(cfg.held_out), examples=int(cfg.examples),
                   fail_on_duplicates=bool(cfg.fail_on_duplicates), workers=cfg.workers)
    if cfg.get("corpus"):
        result["corpus"] = corpus_overlap(source, Path(cfg.corpus), list(cfg.held_out), int(cfg.examples))
        result["summary"]["passed"] = result["summary"]["passed"] and result["corpus"]["passed"]
    out = Path(cfg.paths.output_dir)
    write_json(out / "audit.json", result)
    write_text(out / "audit.md", to_markdown(result))
    return result


def exit_status(result: dict) -> int:
    """1 when the audit found leakage (or, as configured, duplicates), else 0."""
    return 0 if result["summary"]["passed"] else 1


@command("audit", run_folder=True)
def main(cfg: DictConfig) -> None:
    from llasmol.leakage import summary_lines  # lazy: as in run_audit

    result = run_audit(cfg)
    print("\n".join(summary_lines(result)))
    print(f"report written to {Path(cfg.paths.output_dir) / 'audit.md'} (and audit.json)", flush=True)
    status = exit_status(result)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main.from_command_line()  # a mistyped setting (held_outt=...) is one line, before Hydra starts
