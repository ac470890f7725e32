"""The SHA-256 of the files a run's settings name (`model_args.pretrained`, `data_args.partition_path`):
part of the settings every process of a run agrees on (`deploy.shared_config`, checked when a silo
builds from the server's config and at HELLO) and of a checkpoint's config (checked by --resume), so
that another file under the same path is refused like any other changed setting."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedml_moon.core.pretrained import sha256

FILES = {
    "model_args.pretrained": "model_args.pretrained_sha256",
    "data_args.partition_path": "data_args.partition_sha256",
}
"""A setting naming a file -> the key of its digest beside the settings."""
DIGEST_KEYS = frozenset(FILES.values())
_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (kept per path, size and modification time: a run hashes each once)."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = sha256(p)
    return _CACHE[key]


def partition_sha256(path: str | Path) -> str:
    """A partition file's digest: its `partition.json`, and the arrays file that it names beside it
    (`data.partition_file`), if any: another partition under the same paths differs in one of them."""
    digest = file_sha256(path)
    try:
        arrays = json.loads(Path(path).expanduser().read_text()).get("arrays")
    except (OSError, ValueError, AttributeError):
        return digest  # not the run's to judge here: reading the partition says what is wrong
    beside = Path(path).expanduser().parent / str(arrays) if isinstance(arrays, str) else None
    if beside is None or not beside.is_file():
        return digest
    return hashlib.sha256(f"{digest}:{file_sha256(beside)}".encode()).hexdigest()


def file_digests(flat: dict[str, Any]) -> dict[str, str]:
    """The digest of each file that the dotted settings `flat` name (and that exists), by digest key."""
    out = {}
    for setting, key in FILES.items():
        path = flat.get(setting)
        if path and Path(path).expanduser().is_file():
            out[key] = partition_sha256(path) if setting == "data_args.partition_path" else file_sha256(path)
    return out


def setting_of(digest_key: str) -> str:
    """The setting whose file `digest_key` digests."""
    return next(s for s, k in FILES.items() if k == digest_key)


def digest_problem(setting_key: str, mine: Any, theirs: Any, path: Any) -> str:
    """What a process says when its file under a setting's path is not the server's (or the checkpoint's)."""
    setting = setting_of(setting_key)
    return (
        f"{setting}: the file {path} here has sha256 {str(mine)[:16]}, the run's has "
        f"{str(theirs)[:16]}; give every process of the run the same file (or start a new run with this one)"
    )
