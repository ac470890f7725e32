"""Checkpoints on disk: written atomically, read without pickle.

A checkpoint is a folder `<root>/round-<r>/` of codec files (safetensors + JSON, see
`fedml_moon.core.codec`), one per part (`server`, `parties`, ...). It is written as `<root>/.tmp-<r>/`,
every file and the folder fsynced, then renamed into place, and only then is `<root>/LATEST` (the
round number) replaced atomically. A crash at any moment leaves the previous checkpoint whole and
LATEST pointing at it; half-written folders are removed at the next write. The `keep` newest
checkpoints are kept (a worker keeps two, so it can serve a server whose own last write did not
finish).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

from fedml_moon.core.codec import CodecError, decode, encode

LATEST = "LATEST"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message says which file and why."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_checkpoint(root: Path, round_idx: int, parts: dict[str, Any], keep: int = 1) -> Path:
    """Write `parts` (name -> tree) as the checkpoint of `round_idx`; returns its folder."""
    root = Path(root)
    final, tmp = root / f"round-{round_idx}", root / f".tmp-{round_idx}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        for name, tree in parts.items():
            _write_file(tmp / f"{name}.fmc", encode(tree))
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_file(root / ".LATEST.tmp", str(round_idx).encode())
        os.replace(root / ".LATEST.tmp", root / LATEST)
        _fsync_dir(root)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        hint = "the disk is full; free space, then resume" if err.errno == errno.ENOSPC else str(err)
        raise CheckpointError(
            f"could not write the checkpoint of round {round_idx} in {root}: {hint}"
        ) from None
    for old in sorted(rounds(root))[:-keep]:
        shutil.rmtree(root / f"round-{old}", ignore_errors=True)
    return final


def rounds(root: Path) -> list[int]:
    """The rounds of the complete checkpoints under `root` (ascending)."""
    out = []
    for path in Path(root).glob("round-*"):
        suffix = path.name.split("-", 1)[1]
        if suffix.isdigit() and path.is_dir():
            out.append(int(suffix))
    return sorted(out)


def latest(root: Path) -> int | None:
    """The round LATEST names, or None when there is no checkpoint."""
    path = Path(root) / LATEST
    if not path.is_file():
        return None
    text = path.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{path} does not hold a round number ({text[:40]!r})")
    return int(text)


def read_checkpoint(root: Path, round_idx: int, names: tuple[str, ...]) -> dict[str, Any]:
    """The parts `names` of the checkpoint of `round_idx`."""
    folder = Path(root) / f"round-{round_idx}"
    out = {}
    for name in names:
        path = folder / f"{name}.fmc"
        try:
            out[name] = decode(path.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(
                f"{path} is missing: the checkpoint of round {round_idx} is incomplete"
            ) from None
        except CodecError as err:
            raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from None
    return out
