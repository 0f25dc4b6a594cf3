"""Fetch the official SMolInstruct archive from the Hugging Face Hub into a local folder."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from llasmol.errors import UserError

ARCHIVE = "data.zip"


def default_cache_dir() -> Path:
    base = os.environ.get("LLASMOL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "llasmol"))
    return Path(base)


def fetch_smolinstruct(repo_id: str, cache_dir: Path | None = None) -> Path:
    """Download (once) and extract the archive of `repo_id`; return the root of its official layout."""
    target = (cache_dir or default_cache_dir()) / repo_id.replace("/", "--")
    done = target / ".extracted"
    if done.is_file():
        return _layout_root(target)
    from llasmol.offline import cached_on_disk, hub_unreachable

    fix = "set data.path=<folder with raw/, sample/, template/, core_tag/> to use a local copy"
    reason = hub_unreachable()
    local_only = reason is not None and cached_on_disk(repo_id, ARCHIVE, repo_type="dataset")
    if reason is not None and not local_only:
        raise UserError(f"cannot fetch dataset {repo_id} from the Hugging Face Hub ({reason}): {fix}")
    try:
        from huggingface_hub import hf_hub_download

        archive = hf_hub_download(repo_id=repo_id, filename=ARCHIVE, repo_type="dataset", local_files_only=local_only)
    except Exception as err:  # unknown repo, no credentials, a failed download: the same for the user
        raise UserError(f"cannot fetch dataset {repo_id} from the Hugging Face Hub ({type(err).__name__}): {fix}") from None
    tmp = target.with_name(target.name + ".partial")
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)
    done.touch()
    return _layout_root(target)


def _layout_root(folder: Path) -> Path:
    # The archive may hold the layout at its top or inside one folder (e.g. data/).
    if (folder / "sample").is_dir():
        return folder
    for child in sorted(folder.iterdir()):
        if (child / "sample").is_dir():
            return child
    raise UserError(f"{folder} holds no SMolInstruct layout (no sample/ folder): delete it and fetch again")
