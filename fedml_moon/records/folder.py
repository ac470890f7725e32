"""A run's records in its output folder, and the rule that a new run never writes over an earlier
run's: the process that writes them (the standalone simulation, a distributed run's server) refuses
a folder that holds them unless told `--resume` (go on with that run) or `--overwrite` (replace them).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedml_moon.config.schema import ConfigError
from fedml_moon.run_folder import CHECKPOINT, RECORDS, WANDB, RunFolder

log = logging.getLogger(__name__)


def earlier_records(out_dir: Path) -> list[str]:
    """The records of an earlier run in `out_dir`: a non-empty metrics.jsonl, a summary.json, a
    checkpoint, a model file (`final_model.pt`, `model_at_<status>.pt`)."""
    folder = RunFolder(out_dir)
    found = [path.name for path in (folder.summary, folder.final_model) if path.is_file()]
    if folder.metrics.is_file() and folder.metrics.stat().st_size > 0:
        found.insert(0, folder.metrics.name)
    if folder.checkpointed:
        found.append(f"{CHECKPOINT}/")
    found += [path.name for path in folder.models_at()]
    return found


_PENDING: dict[Path, set[str]] = {}  # folders whose earlier records this process replaces (--overwrite),
# and what their wandb/ held then: this run's W&B files go there before its first record


def claim_folder(out_dir: Path, overwrite: bool, resumable: bool = True) -> None:
    """Let a new run write its records in `out_dir`: refused (a ConfigError naming the ways on: with
    `resumable`, going on with it by --resume too) where an earlier run's are there, unless
    `overwrite`: then they are removed when this run first writes its own (`replace_earlier`, from the
    run's recorder), so that a run refused before it starts (its data, its config) still leaves them as
    they were."""
    found = earlier_records(out_dir)
    if not found:
        return
    if not overwrite:
        resume = f"go on with that run with --resume {out_dir}, " if resumable else ""
        raise ConfigError(
            f"--output-dir {out_dir} holds an earlier run's records ({', '.join(found)}); {resume}keep it "
            "and give this run another --output-dir, or replace its records with --overwrite"
        )
    key = Path(out_dir).resolve()
    _PENDING[key] = {p.name for p in RunFolder(key).wandb.glob("*") if not p.is_symlink()}  # runs, not links


def replace_earlier(out_dir: Path) -> None:
    """Remove the earlier run's records from `out_dir` if `claim_folder` was told to replace them
    (of `wandb/`, what it held then: this run's own W&B files are already there)."""
    key = Path(out_dir).resolve()
    if key not in _PENDING:
        return
    earlier_wandb = _PENDING.pop(key)
    found = earlier_records(out_dir)
    folder = RunFolder(key)
    names = [n for n in RECORDS if n != WANDB] + [p.name for p in folder.models_at()]
    for path in [key / n for n in names] + [folder.wandb / n for n in sorted(earlier_wandb)]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    log.warning("--overwrite: removed the earlier run's records in %s (%s)", out_dir, ", ".join(found))


@contextmanager
def held(path: Path, taken: Exception) -> Iterator[None]:
    """Hold an exclusive lock on `path` (a folder, or a lock file, made if missing) while the block
    runs; `taken` raised if another process holds it. The kernel lets go of it when the holder
    ends, even by SIGKILL."""
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY) if path.is_dir() else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise taken from None
        yield
    finally:
        os.close(fd)


@contextmanager
def running(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir`'s lock (on the folder itself: no file is added to it) while this process runs
    the run there: a second process given the same folder (a sweep started twice, a job and a local
    run) is refused instead of writing the same records. A folder made here that the run left empty
    (refused before it wrote anything) is removed."""
    out_dir = Path(out_dir)
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    busy = ConfigError(
        f"{out_dir}: another process is running this run now (its records are being written); "
        "let it end, or stop it, before starting it again"
    )
    try:
        with held(out_dir, busy):
            yield
    finally:
        if made:
            with contextlib.suppress(OSError):
                out_dir.rmdir()


def in_progress(out_dir: Path) -> bool:
    """Whether a live process is running the run in `out_dir` (holds its folder's lock)."""
    if not Path(out_dir).is_dir():
        return False
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
