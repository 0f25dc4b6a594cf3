"""The predictions of an evaluation in progress, kept as they are made.

`<split>.jsonl.partial`, beside the final `<split>.jsonl`, is append-only: a first line naming the settings
the answers depend on, then one complete line per record, pushed to the disk as each batch finishes. A
stopped or killed evaluation keeps every batch it finished; the same command reads them back, answers only
the rest, writes the final file and removes the partial one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from llasmol.core.errors import UserError
from llasmol.core.files import append_jsonl, complete_jsonl

SUFFIX = ".partial"


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + SUFFIX)


class PartialPredictions:
    """The partial file of the predictions file `final`, for answers made under `settings` (plain JSON)."""

    def __init__(self, final: Path, settings: dict) -> None:
        self.path = partial_path(Path(final))
        self.settings = settings
        self._fh = None
        self.count = 0  # records in the file

    def resume(self) -> dict[int, dict]:
        """The records a stopped run left (by sample index), and the file opened, and locked, to take more."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("ab")
        self._lock()
        done: dict[int, dict] = {}
        lines = complete_jsonl(self.path)
        if lines:
            try:
                self._check(lines[0].get("settings"))
            except UserError:
                self.close()
                raise
            done = {r["index"]: r for r in lines[1:]}
        if self.path.stat().st_size == 0:
            append_jsonl(self._fh, [{"settings": self.settings}])
        self.count = len(done)
        return done

    def _lock(self) -> None:
        """Two evaluations answering into one folder at once would interleave their lines and each take the
        other's as done: the second is refused while the first holds the file (the lock ends with it)."""
        import fcntl

        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise UserError(f"{self.path} is being written by another evaluation running now: wait for it to end "
                            "(its results land in the same files), or give this one another hydra.run.dir") from None
        except OSError:
            pass  # a file system without locks (some network mounts): nothing to hold

    def _check(self, before: Optional[dict]) -> None:
        changed = sorted(k for k in {*self.settings, *(before or {})}
                         if (before or {}).get(k) != self.settings.get(k))
        if changed:
            key = changed[0]
            raise UserError(f"{self.path} holds the answers of a stopped evaluation with {key}="
                            f"{(before or {}).get(key)!r}, not {self.settings.get(key)!r}: run it again with "
                            f"the same settings to continue it, or delete that file to start over")

    def append(self, records: list[dict]) -> None:
        append_jsonl(self._fh, records)
        self.count += len(records)

    def answered(self) -> int:
        """The records in the file, read back: a signal can land after a batch's write and before the
        count above moves, and the file is what a continuation will find."""
        self.close()
        return max(0, len(complete_jsonl(self.path)) - 1) if self.path.is_file() else 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
