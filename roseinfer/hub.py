"""The Hugging Face Hub, through `huggingface_hub`: the local cache first, then a download.

Only the files the engine reads are fetched: for a model `config.json` and its
safetensors (one file, or an index and its shards); for a tokenizer
`tokenizer.json`, or GPT-2's `vocab.json` + `merges.txt`.

Offline must be cheap. Before anything is downloaded, one HEAD request for
`config.json` probes the endpoint with a short timeout, in a daemon thread we
wait on for at most `HUB_TIMEOUT_S`: a resolver that hangs cannot hold us up
either. `huggingface_hub` itself retries an unreachable Hub for a long time,
so it is only called once the probe has answered. `HF_HUB_OFFLINE=1` and
`offline=True` skip the network altogether. `HF_ENDPOINT` and `HF_HUB_CACHE`
are read at call time (huggingface_hub reads them once, at import), so a test
can point them at a Hub-compatible server of its own and a temporary cache.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("roseinfer")

HUB_TIMEOUT_S = 3.0  # connect + first answer of the probe; the Hub answers a HEAD in well under a second
MODEL_FILES = ("config.json", "model.safetensors")
SHARDED_INDEX = "model.safetensors.index.json"
# What a cached snapshot may hold (older downloads of transformers left pytorch_model.bin).
MODEL_FILE_SETS = (MODEL_FILES, ("config.json", SHARDED_INDEX), ("config.json", "pytorch_model.bin"))
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"))
# Beside the weights when a repository has them: the tokenizer, its chat template, the end-of-turn ids.
COMPANION_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


class HubUnavailable(RuntimeError):
    """The Hub is not reachable (offline, no network, or it did not answer in time)."""


class NotOnHub(LookupError):
    """The Hub answered, and it has no such repository or file."""


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def is_repo_id(name: str) -> bool:
    """A Hub id such as gpt2 or org/name; a path such as /tmp/x or ./x is not."""
    return bool(_REPO_ID.match(name)) and ".." not in name


def offline_mode(offline: bool = False) -> bool:
    """The explicit flag, or HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE as set now (not at import)."""
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return offline or env.strip().upper() in ("1", "ON", "YES", "TRUE")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hf():
    """huggingface_hub's download functions (its package imports them lazily, on first use)."""
    with warnings.catch_warnings():  # in a notebook without ipywidgets, tqdm warns at import
        warnings.filterwarnings("ignore", message="IProgress not found")
        from huggingface_hub import file_download

    return file_download


def cache_dir() -> str | None:
    """HF_HUB_CACHE as set now (None: huggingface_hub's default, from HF_HOME)."""
    return os.environ.get("HF_HUB_CACHE") or None


def cached_file(repo_id: str, filename: str) -> Path | None:
    """A file of the repository's main revision in the local HF cache, never touching the network."""
    try:
        path = _hf().hf_hub_download(repo_id, filename, cache_dir=cache_dir(), local_files_only=True)
    except Exception:  # not cached, or a malformed id
        return None
    return Path(path)


def cached_snapshot(repo_id: str, file_sets: tuple[tuple[str, ...], ...]) -> Path | None:
    """The cached snapshot folder if it holds every file of one of `file_sets`."""
    for files in file_sets:
        paths = [cached_file(repo_id, f) for f in files]
        if all(paths):
            return paths[0].parent
    return None


def probe(repo_id: str, filename: str, timeout: float = HUB_TIMEOUT_S) -> None:
    """Raise HubUnavailable unless the endpoint answers for this file in time; NotOnHub if it has none."""
    hf = _hf()
    url = hf.hf_hub_url(repo_id, filename, endpoint=endpoint())
    outcome: list[BaseException | None] = []

    def head() -> None:
        try:
            hf.get_hf_file_metadata(url, timeout=timeout)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=head, name="roseinfer-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    if not outcome:
        raise HubUnavailable(f"{endpoint()} did not answer within {timeout:.0f}s")
    error = outcome[0]
    if error is None:
        return
    from huggingface_hub.errors import HfHubHTTPError

    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, HfHubHTTPError) and status in (401, 403, 404):
        raise NotOnHub(f"{repo_id}/{filename} is not on {endpoint()} (HTTP {status})") from error
    raise HubUnavailable(f"{endpoint()} is not reachable: {error.__class__.__name__}: {error}") from error


def download(repo_id: str, filenames: list[str], offline: bool = False) -> Path:
    """Download files of one repository into the HF cache; returns their snapshot folder."""
    if offline_mode(offline):
        raise HubUnavailable("offline (HF_HUB_OFFLINE or --offline)")
    probe(repo_id, filenames[0])
    logger.info("roseinfer: downloading %s from %s/%s", ", ".join(filenames), endpoint(), repo_id)
    hf = _hf()
    paths = [
        Path(
            hf.hf_hub_download(
                repo_id, f, cache_dir=cache_dir(), endpoint=endpoint(), etag_timeout=HUB_TIMEOUT_S
            )
        )
        for f in filenames
    ]
    return paths[0].parent


def download_model(repo_id: str, offline: bool = False) -> Path:
    """config.json and the safetensors weights (single file, else the shards of the index), and the
    COMPANION_FILES the repository has."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        folder = download(repo_id, list(MODEL_FILES), offline)
    except EntryNotFoundError:  # no single file: a sharded checkpoint
        folder = download(repo_id, ["config.json", SHARDED_INDEX], offline)
        shards = sorted(set(json.loads((folder / SHARDED_INDEX).read_text())["weight_map"].values()))
        download(repo_id, shards, offline)
    for name in COMPANION_FILES:
        try:
            download(repo_id, [name], offline)
        except (EntryNotFoundError, NotOnHub):
            continue
    return folder


def download_tokenizer(repo_id: str, offline: bool = False) -> Path:
    """tokenizer.json, else vocab.json + merges.txt."""
    for files in TOKENIZER_FILE_SETS:
        try:
            return download(repo_id, list(files), offline)
        except NotOnHub:
            continue
    raise NotOnHub(f"{repo_id} has neither tokenizer.json nor vocab.json + merges.txt")


@dataclass
class HubFiles:
    folder: Path  # the snapshot folder in the HF cache
    repo_id: str
    source: str  # "hf-cache" | "hf-hub"


def resolve(
    repo_ids: tuple[str, ...],
    file_sets: tuple[tuple[str, ...], ...],
    fetch: Callable[[str, bool], Path],
    offline: bool = False,
) -> HubFiles:
    """The first id in the local cache, else the first the Hub has; HubUnavailable / NotOnHub say why not."""
    for repo_id in repo_ids:
        folder = cached_snapshot(repo_id, file_sets)
        if folder is not None:
            return HubFiles(folder, repo_id, "hf-cache")
    if offline_mode(offline):
        raise HubUnavailable("offline (HF_HUB_OFFLINE or --offline)")
    missing: NotOnHub | None = None
    for repo_id in repo_ids:
        try:
            return HubFiles(fetch(repo_id, offline), repo_id, "hf-hub")
        except NotOnHub as exc:  # an unreachable Hub (HubUnavailable) ends the search at once
            missing = exc
    raise missing or NotOnHub("no repository id to look up")
