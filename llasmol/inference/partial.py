"""The predictions of an evaluation in progress, kept as they are made.

`<split>.jsonl.partial`, beside the final `<split>.jsonl`, is append-only: a first line naming the settings
the answers depend on, then one complete line per record, pushed to the disk as each batch finishes. A
stopped or killed evaluation keeps every batch it finished; the same command reads them back, answers only
the rest, writes the final file and removes the partial one. Of each kept line only the sample's index, the
responses and whether each ended are taken back; the rest of its record is made again from the split (the line is read as the
same command's own output, and a line edited since is refused by its number, not half-used).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from llasmol.core.errors import UserError
from llasmol.core.files import append_jsonl, complete_jsonl, complete_lines
from llasmol.inference.predictions import Responses

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

    def resume(self, indices: set[int]) -> dict[int, Optional[list[str]]]:
        """The responses a stopped run left, by sample index (None: the sample was skipped), and the file
        opened, and locked, to take more. `indices`: the samples this evaluation answers."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("ab")
        self._lock()
        try:
            done = self._read(indices)
        except UserError:
            self.close()
            raise
        if self.path.stat().st_size == 0:
            append_jsonl(self._fh, [{"settings": self.settings}])
        self.count = len(done)
        return done

    def _read(self, indices: set[int]) -> dict[int, Optional[list[str]]]:
        done: dict[int, Optional[list[str]]] = {}
        for number, line in enumerate(complete_lines(self.path), 1):
            why, record = None, None
            try:
                record = json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError):  # not UTF-8, not JSON, numbers past Python's digit limit
                why = "is not a JSON line"
            if why is None and number == 1:
                if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
                    why = "is not the settings line this command writes first"
                else:
                    self._check(record["settings"])
                    continue
            if why is None:
                why = self._record_problem(record, indices, done)
            if why:
                raise UserError(f"{self.path} line {number} {why}: the file was changed since the evaluation "
                                "stopped; delete it to start over (its samples are answered again)")
            responses, ended = record["predictions"], record.get("ended")
            done[record["index"]] = responses if responses is None or ended is None else Responses(responses, ended)
        return done

    @staticmethod
    def _record_problem(record, indices: set[int], done: dict) -> Optional[str]:
        if not isinstance(record, dict):
            return "is not a JSON object"
        index, responses = record.get("index"), record.get("predictions")
        if not isinstance(index, int) or isinstance(index, bool) or index not in indices:
            return f"has index {json.dumps(index)[:40]}, which is no sample of this evaluation"
        if index in done:
            return f"answers sample {index} a second time"
        if "predictions" not in record:
            return "lacks predictions"
        if responses is not None and not (isinstance(responses, list) and all(isinstance(r, str) for r in responses)):
            return f"has predictions {json.dumps(responses)[:60]}, not a list of responses (or null)"
        ended = record.get("ended")
        if ended is not None and not (isinstance(ended, list) and isinstance(responses, list)
                                      and len(ended) == len(responses) and all(isinstance(e, bool) for e in ended)):
            return f"has ended {json.dumps(ended)[:60]}, not one true or false a response"
        return None

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
