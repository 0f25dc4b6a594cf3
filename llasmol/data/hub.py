"""Fetch the official SMolInstruct archive from the Hugging Face Hub into a local folder."""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path
from typing import Optional

from llasmol.core import offline  # its functions are looked up at each call, so a test can stand in for the Hub
from llasmol.core.errors import UserError

ARCHIVE = "data.zip"
DONE = ".extracted"


def default_cache_dir() -> Path:
    base = os.environ.get("LLASMOL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "llasmol"))
    return Path(base)


def fetch_smolinstruct(repo_id: str, revision: str = "main", cache_dir: Path | None = None) -> Path:
    """The root of the official layout of `repo_id`'s archive at `revision` (a branch, tag or commit).

    The archive comes through the Hugging Face cache, which asks the Hub whether `revision` has moved; it
    is extracted once per archive *content*, so `main` picks up a new release while a pinned commit never
    changes. Without the Hub, the newest extraction of `revision` is used.
    """
    base = _extractions(repo_id, revision, cache_dir)
    local_only, newest = _without_hub(repo_id, revision, base)
    if newest is not None:
        return _layout_root(newest)
    try:
        from huggingface_hub import hf_hub_download

        archive = Path(hf_hub_download(repo_id=repo_id, filename=ARCHIVE, repo_type="dataset", revision=revision,
                                       local_files_only=local_only))
    except Exception as err:  # unknown repo or revision, no credentials, a failed download: the same for the user
        raise UserError(
            f"cannot fetch dataset {repo_id} at revision {revision} from the Hugging Face Hub "
            f"({type(err).__name__}): {_FIX}"
        ) from None
    target = base / _content_key(archive)
    if not (target / DONE).is_file():
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        (target / DONE).touch()
    return _layout_root(target)


_FIX = "set data.path=<folder with raw/, sample/, template/, core_tag/> to use a local copy"


def _extractions(repo_id: str, revision, cache_dir: Path | None) -> Path:
    if not isinstance(revision, str) or not revision:
        raise UserError(f"data.revision={revision!r} is not a revision name: give a branch, tag or commit, e.g. main")
    return (cache_dir or default_cache_dir()) / f"{repo_id}@{revision}".replace("/", "--")


def _without_hub(repo_id: str, revision: str, base: Path) -> tuple[bool, Optional[Path]]:
    """When the Hub cannot be reached: (True, None) if the Hugging Face cache holds the archive, else (False, the
    newest extraction of `revision`); a `UserError` if there is neither. (False, None) when the Hub may be reached."""
    reason = offline.hub_unreachable()
    if reason is None:
        return False, None
    if offline.cached_on_disk(repo_id, ARCHIVE, repo_type="dataset", revision=revision):
        return True, None
    newest = _newest_extraction(base)
    if newest is None:
        raise UserError(f"cannot fetch dataset {repo_id} at revision {revision} from the Hugging Face Hub ({reason}): "
                        f"{_FIX}")
    return False, newest


def check_fetchable(repo_id: str, revision: str = "main", cache_dir: Path | None = None) -> None:
    """The line `fetch_smolinstruct` would give for an archive neither on this machine nor reachable, said before a
    run builds its model and starts its loggers (the fetch itself waits for Lightning's `prepare_data`, which
    runs it once per node)."""
    _without_hub(repo_id, revision, _extractions(repo_id, revision, cache_dir))


def _content_key(archive: Path) -> str:
    """A name for the archive's content: the Hugging Face cache stores files as blobs named by their hash."""
    blob = archive.resolve()
    if blob.parent.name == "blobs":
        return blob.name[:16]
    digest = hashlib.sha256()
    with blob.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _newest_extraction(base: Path) -> Optional[Path]:
    done = [d for d in base.glob("*") if (d / DONE).is_file()] if base.is_dir() else []
    return max(done, key=lambda d: (d / DONE).stat().st_mtime_ns) if done else None


def _layout_root(folder: Path) -> Path:
    # The archive may hold the layout at its top or inside one folder (e.g. data/).
    if (folder / "sample").is_dir():
        return folder
    for child in sorted(folder.iterdir()):
        if (child / "sample").is_dir():
            return child
    raise UserError(f"{folder} holds no SMolInstruct layout (no sample/ folder): delete it and fetch again")
