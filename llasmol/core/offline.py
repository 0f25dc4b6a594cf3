"""Is the Hugging Face Hub reachable? Asked once, before a download that would otherwise retry for a
minute and print a warning per retry when the machine has no network; and an upload that says where its folder
stays when it is not."""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import Optional
from urllib.parse import urlparse

from llasmol.core.errors import UserError

_PROBE_SECONDS = 3.0


@functools.lru_cache(maxsize=1)
def hub_unreachable() -> Optional[str]:
    """Why the Hub cannot be reached (a short reason), or None when it may be."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy decides; a direct probe would prove nothing
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    outcome: list[Optional[str]] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=_PROBE_SECONDS).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{host} unreachable: {err.strerror or type(err).__name__}")

    # A thread, because name resolution has no timeout of its own.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(_PROBE_SECONDS + 1)
    return outcome[0] if outcome else f"{host} did not answer within {_PROBE_SECONDS:g} s"


def cached_on_disk(repo_id: str, filename: str = "config.json", repo_type: str = "model",
                   revision: Optional[str] = None) -> bool:
    """Whether the Hugging Face cache already holds `filename` of `repo_id` (at `revision`)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, filename, revision=revision, repo_type=repo_type), str)
    except ValueError:  # not a valid repository id (HFValidationError): nothing of it can be cached
        return False


def push_folder(folder, repo_id: str) -> None:
    """Upload `folder` to the Hub repo `repo_id` (made if missing); offline, one line saying where the folder is."""
    reason = hub_unreachable()
    if reason is not None:
        raise UserError(f"push_to_hub={repo_id}: the Hub is not reachable ({reason}); the exported folder is "
                        f"{folder}: upload it later with `hf upload {repo_id} {folder}`")
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id)
