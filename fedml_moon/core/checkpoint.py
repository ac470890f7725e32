"""Checkpoints on disk: written atomically, read without pickle.

A checkpoint is a folder `<root>/round-<r>/` of codec files (safetensors + JSON, see
`fedml_moon.core.codec`), one per part (`server`, `parties`, ...). It is written as `<root>/.tmp-<r>/`,
every file and the folder fsynced, then renamed into place, and only then is `<root>/LATEST` (the
round number) replaced atomically. A crash at any moment leaves the previous checkpoint whole and
LATEST pointing at it; half-written folders are removed at the next write, and an old checkpoint is
renamed out of sight (`.del-*`) before it is removed. The `keep` newest checkpoints are kept (a worker
keeps two, so it can serve a server whose own last write did not finish).

Writing a round that already has a folder (a resumed run checkpointing again a round it recomputed)
first renames the old folder aside to `<root>/.old-<r>/`, renames the new one into place, and removes
the old one only after LATEST is written. Until then `.old-<r>` stands in for a missing `round-<r>`
(`rounds`, `read_checkpoint`), and the next write puts it back in place: LATEST never names a round
without a complete folder, and a stale folder is removed only while a complete copy of its round
remains.

The names inside `<root>` are this module's own (`round-<r>`, `.tmp-<r>`, `.old-<r>`, `.del-*`), but
`LATEST`, which says to others that a run folder holds a checkpoint, is the run folder's layout's
(`fedml_moon.run_folder`, standard library only); the caller names `<root>`.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fedml_moon.core.codec import CodecError, decode, encode
from fedml_moon.errors import CheckpointError  # noqa: F401 (raised here, caught by the command line)
from fedml_moon.run_folder import LATEST  # the run folder's names (standard library only)


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


def _round_of(path: Path, prefix: str) -> int | None:
    suffix = path.name[len(prefix) :]
    return int(suffix) if path.name.startswith(prefix) and suffix.isdigit() and path.is_dir() else None


def _recover(root: Path) -> None:
    """Tidy what an interrupted write left: an `.old-<r>` whose `round-<r>` is in place is a stale
    copy (removed); one whose `round-<r>` is missing is the only copy (renamed back into place)."""
    for old in root.glob(".old-*"):
        r = _round_of(old, ".old-")
        if r is None:
            continue
        final = root / f"round-{r}"
        if final.is_dir():
            _remove(root, old.name)
        else:
            os.replace(old, final)
            _fsync_dir(root)


class Pieces:
    """A checkpoint part written one piece at a time, as `<part>/<key>.fmc` (each party's state): `make`
    maps a key to a function that gives the piece, so only one piece is in memory at once."""

    def __init__(self, make: Mapping[str, Callable[[], Any]]) -> None:
        self.make = dict(make)


class LazyPieces(Mapping):
    """A `Pieces` part read back: each piece decoded when it is asked for."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.keys_ = sorted(p.stem for p in folder.glob("*.fmc"))

    def __getitem__(self, key: str) -> Any:
        path = self.folder / f"{key}.fmc"
        try:
            return decode(path.read_bytes())
        except FileNotFoundError:
            raise KeyError(key) from None
        except CodecError as err:
            raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)


def _write_part(folder: Path, name: str, tree: Any) -> None:
    if not isinstance(tree, Pieces):
        _write_file(folder / f"{name}.fmc", encode(tree))
        return
    (folder / name).mkdir()
    for key, make in tree.make.items():
        _write_file(folder / name / f"{key}.fmc", encode(make()))
    _fsync_dir(folder / name)


def write_checkpoint(root: Path, round_idx: int, parts: dict[str, Any], keep: int = 1) -> Path:
    """Write `parts` (name -> tree) as the checkpoint of `round_idx`; returns its folder."""
    root = Path(root)
    final, tmp, aside = root / f"round-{round_idx}", root / f".tmp-{round_idx}", root / f".old-{round_idx}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _recover(root)
        for stale in [*root.glob(".tmp-*"), *root.glob(".del-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        for name, tree in parts.items():
            _write_part(tmp, name, tree)
        _fsync_dir(tmp)
        if final.exists():
            os.replace(final, aside)  # kept whole until LATEST is written below
        os.replace(tmp, final)
        _write_file(root / ".LATEST.tmp", str(round_idx).encode())
        os.replace(root / ".LATEST.tmp", root / LATEST)
        _fsync_dir(root)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _recover(root)
        except OSError:
            pass  # `.old-<r>` still stands in for `round-<r>`; the next write tries again
        hint = "the disk is full; free space, then resume" if err.errno == errno.ENOSPC else str(err)
        raise CheckpointError(
            f"could not write the checkpoint of round {round_idx} in {root}: {hint}"
        ) from None
    _remove(root, aside.name)
    # LATEST names round_idx, whole: keep it and the keep - 1 newest before it. A round after it is
    # left from a timeline a resume abandoned.
    older = [r for r in rounds(root) if r < round_idx]
    stale = [r for r in rounds(root) if r > round_idx] + older[: max(0, len(older) - (keep - 1))]
    for old in stale:
        _remove(root, f"round-{old}")
        _remove(root, f".old-{old}")
    return final


def _remove(root: Path, name: str) -> None:
    """Remove a folder as a whole: renamed out of sight first, so no half-removed folder is ever taken
    for a checkpoint."""
    gone = root / f".del-{name}"
    try:
        os.replace(root / name, gone)
    except OSError:
        return  # not there (or not removable now; the next write tries again)
    shutil.rmtree(gone, ignore_errors=True)


def _folder(root: Path, round_idx: int) -> Path:
    """`round-<r>`, or the `.old-<r>` an interrupted rewrite of that round left in its place."""
    final = Path(root) / f"round-{round_idx}"
    aside = Path(root) / f".old-{round_idx}"
    return aside if not final.is_dir() and aside.is_dir() else final


def rounds(root: Path) -> list[int]:
    """The rounds of the complete checkpoints under `root` (ascending)."""
    root = Path(root)
    found = {_round_of(p, "round-") for p in root.glob("round-*")}
    found |= {_round_of(p, ".old-") for p in root.glob(".old-*")}
    return sorted(r for r in found if r is not None)


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
    folder = _folder(root, round_idx)
    out = {}
    for name in names:
        path = folder / f"{name}.fmc"
        if (folder / name).is_dir():
            out[name] = LazyPieces(folder / name)
            continue
        try:
            out[name] = decode(path.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(
                f"{path} is missing: the checkpoint of round {round_idx} is incomplete"
            ) from None
        except CodecError as err:
            raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from None
    return out
