"""llasmol.data.hub: where the Hub's SMolInstruct archive is extracted, under which name, and what is said
when it cannot be had. The Hub itself is stood in for (tests never download)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest
from refusals import refused

import llasmol.core.offline
from llasmol.core.errors import UserError
from llasmol.data import hub


def _archive(path: Path, top: str = "data/") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{top}sample/train/x.json", "{}")
        zf.writestr(f"{top}raw/train/x.jsonl", "")
    return path


def test_the_cache_folder_is_llasmol_cache_or_under_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("LLASMOL_CACHE", str(tmp_path / "c"))
    assert hub.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LLASMOL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.default_cache_dir() == tmp_path / "home" / ".cache" / "llasmol"


def test_an_archive_is_named_by_its_content(tmp_path):
    # In the Hugging Face cache a file is a link to a blob named by its hash: that name, cut to 16 characters.
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    blob = blobs / ("ab12" * 16)
    blob.write_bytes(b"zip bytes")
    link = tmp_path / "snapshots" / "data.zip"
    link.parent.mkdir()
    link.symlink_to(blob)
    assert hub._content_key(link) == "ab12" * 4
    # Elsewhere the content is hashed.
    loose = tmp_path / "data.zip"
    loose.write_bytes(b"x" * (3 << 20))  # more than one 1 MiB read
    assert hub._content_key(loose) == hashlib.sha256(b"x" * (3 << 20)).hexdigest()[:16]


def test_the_layout_is_found_at_the_top_or_in_the_first_folder_holding_it(tmp_path):
    top = tmp_path / "top"
    (top / "sample").mkdir(parents=True)
    (top / "a" / "sample").mkdir(parents=True)
    assert hub._layout_root(top) == top
    inner = tmp_path / "inner"
    for name in ("b", "c", "a_file"):
        (inner / name / "sample").mkdir(parents=True) if name != "a_file" else (inner / name).mkdir(parents=True)
    assert hub._layout_root(inner) == inner / "b"
    (tmp_path / "none" / "data").mkdir(parents=True)
    with refused(tmp_path / "none", "sample/"):
        hub._layout_root(tmp_path / "none")


def test_offline_the_newest_finished_extraction_of_the_revision_is_used(tmp_path, monkeypatch):
    base = tmp_path / "osunlp--SMolInstruct@main"
    assert hub._newest_extraction(base) is None  # nothing extracted yet
    old, new, unfinished = base / "old", base / "new", base / "unfinished"
    for folder, when in ((old, 1_000), (new, 2_000), (unfinished, 3_000)):
        (folder / "sample").mkdir(parents=True)
        if folder is not unfinished:
            (folder / hub.DONE).touch()
            os.utime(folder / hub.DONE, (when, when))
    assert hub._newest_extraction(base) == new
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: "HF_HUB_OFFLINE is set")
    monkeypatch.setattr(llasmol.core.offline, "cached_on_disk", lambda *a, **k: False)
    assert hub.fetch_smolinstruct("osunlp/SMolInstruct", cache_dir=tmp_path) == new
    with refused("osunlp/SMolInstruct", "revision v9", "HF_HUB_OFFLINE is set", "data.path="):
        hub.fetch_smolinstruct("osunlp/SMolInstruct", revision="v9", cache_dir=tmp_path)


def test_whether_the_archive_can_be_had_is_said_before_it_is_fetched(tmp_path, monkeypatch):
    """`check_fetchable` (a run asks it before building its model) refuses exactly where the fetch would, and
    fetches nothing: offline with no extraction nor cached archive; quiet with either, or with the Hub reachable."""
    fetched = []
    monkeypatch.setattr(hub, "_layout_root", lambda folder: fetched.append(folder))
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: "HF_HUB_OFFLINE is set")
    monkeypatch.setattr(llasmol.core.offline, "cached_on_disk", lambda *a, **k: False)
    with refused("osunlp/SMolInstruct", "revision main", "HF_HUB_OFFLINE is set", "data.path="):
        hub.check_fetchable("osunlp/SMolInstruct", cache_dir=tmp_path)
    with refused("data.revision=''"):
        hub.check_fetchable("osunlp/SMolInstruct", revision="", cache_dir=tmp_path)
    monkeypatch.setattr(llasmol.core.offline, "cached_on_disk", lambda *a, **k: True)  # the archive, not extracted
    hub.check_fetchable("osunlp/SMolInstruct", cache_dir=tmp_path)
    monkeypatch.setattr(llasmol.core.offline, "cached_on_disk", lambda *a, **k: False)
    done = tmp_path / "osunlp--SMolInstruct@main" / "x"
    (done / "sample").mkdir(parents=True)
    (done / hub.DONE).touch()
    hub.check_fetchable("osunlp/SMolInstruct", cache_dir=tmp_path)  # an earlier extraction serves offline
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: None)
    hub.check_fetchable("osunlp/SMolInstruct", revision="v9", cache_dir=tmp_path)  # the Hub decides, later
    assert fetched == []


@pytest.mark.parametrize("revision", ["", None, 3])
def test_a_revision_must_be_a_name(tmp_path, revision):
    with refused(f"data.revision={revision!r}"):
        hub.fetch_smolinstruct("osunlp/SMolInstruct", revision=revision, cache_dir=tmp_path)


def test_a_cached_archive_is_read_offline_and_a_torn_extraction_is_redone(tmp_path, monkeypatch):
    import huggingface_hub

    archive = _archive(tmp_path / "data.zip")
    asked = []

    def download(repo_id, filename, repo_type, revision, local_files_only):
        asked.append(local_files_only)
        return str(archive)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: "no network")
    monkeypatch.setattr(llasmol.core.offline, "cached_on_disk", lambda *a, **k: True)
    cache = tmp_path / "cache"
    key = hub._content_key(archive)
    target = cache / "osunlp--SMolInstruct@main" / key
    # A kill mid-extraction left a partial folder and a target without its done mark: both are redone.
    (target.with_name(key + ".partial") / "junk").mkdir(parents=True)
    (target / "stale").mkdir(parents=True)
    root = hub.fetch_smolinstruct("osunlp/SMolInstruct", cache_dir=cache)
    assert asked == [True]  # from the Hugging Face cache only: the Hub is not reachable
    assert root == target / "data" and (root / "sample" / "train" / "x.json").is_file()
    assert not (target / "stale").exists() and not target.with_name(key + ".partial").exists()
    assert (target / hub.DONE).is_file()


def test_a_failed_download_names_the_error_kind_and_the_local_copy_fix(tmp_path, monkeypatch):
    import huggingface_hub

    def download(**kwargs):
        raise ConnectionError("reset by peer")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: None)
    with refused("someone/else", "revision abc", "ConnectionError", "data.path="):
        try:
            hub.fetch_smolinstruct("someone/else", revision="abc", cache_dir=tmp_path)
        except UserError as err:
            assert err.__cause__ is None and err.__suppress_context__  # the ConnectionError's traceback is not kept
            raise
