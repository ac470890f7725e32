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

from fedml_moon.config_schema import ConfigError

log = logging.getLogger(__name__)
RECORDS = (
    "metrics.jsonl",
    "summary.json",
    "checkpoint",
    "final_model.pt",
    "claims.json",
    "party_models",
    "accuracy.png",
    "wandb",
)
"""What a run's server or simulation writes of its own (a silo's files are under `rank-<r>/`)."""


def earlier_records(out_dir: Path) -> list[str]:
    """The records of an earlier run in `out_dir`: a non-empty metrics.jsonl, a summary.json, a
    checkpoint, a model file (`final_model.pt`, `model_at_<status>.pt`)."""
    out_dir = Path(out_dir)
    found = [name for name in ("summary.json", "final_model.pt") if (out_dir / name).is_file()]
    metrics = out_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.insert(0, "metrics.jsonl")
    if (out_dir / "checkpoint" / "LATEST").is_file():
        found.append("checkpoint/")
    found += sorted(p.name for p in out_dir.glob("model_at_*.pt"))
    return found


_PENDING: dict[Path, set[str]] = {}  # folders whose earlier records this process replaces (--overwrite),
# and what their wandb/ held then: this run's W&B files go there before its first record


def claim_folder(out_dir: Path, overwrite: bool) -> None:
    """Let a new run write its records in `out_dir`: refused (a ConfigError naming the three ways on)
    where an earlier run's are there, unless `overwrite`: then they are removed when this run first
    writes its own (`replace_earlier`, from the run's recorder), so that a run refused before it
    starts (its data, its config) still leaves them as they were."""
    found = earlier_records(out_dir)
    if not found:
        return
    if not overwrite:
        raise ConfigError(
            f"--output-dir {out_dir} holds an earlier run's records ({', '.join(found)}); go on with that "
            f"run with --resume {out_dir}, keep it and give this run another --output-dir, or replace its "
            "records with --overwrite"
        )
    key = Path(out_dir).resolve()
    _PENDING[key] = {p.name for p in (key / "wandb").glob("*") if not p.is_symlink()}  # runs, not links


def replace_earlier(out_dir: Path) -> None:
    """Remove the earlier run's records from `out_dir` if `claim_folder` was told to replace them
    (of `wandb/`, what it held then: this run's own W&B files are already there)."""
    key = Path(out_dir).resolve()
    if key not in _PENDING:
        return
    earlier_wandb = _PENDING.pop(key)
    found = earlier_records(out_dir)
    names = [n for n in RECORDS if n != "wandb"] + [p.name for p in key.glob("model_at_*.pt")]
    for path in [key / n for n in names] + [key / "wandb" / n for n in sorted(earlier_wandb)]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    log.warning("--overwrite: removed the earlier run's records in %s (%s)", out_dir, ", ".join(found))


RUN_LOCK = ".running"
"""The file a standalone run holds locked while it runs (the kernel lets go of it when it ends)."""


@contextmanager
def held(path: Path, taken: Exception) -> Iterator[None]:
    """Hold the lock file `path` (its folder made) while the block runs, writing this process's id
    in it; `taken` raised if another process holds it. The kernel lets go of it when the holder ends,
    even by SIGKILL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise taken from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def running(out_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Hold `out_dir`'s run lock while this process runs the run there: a second process given the
    same folder (a sweep started twice, a job and a local run) is refused instead of writing the
    same records."""
    return held(
        Path(out_dir) / RUN_LOCK,
        ConfigError(
            f"{out_dir}: another process is running this run now (its records are being written); "
            "let it end, or stop it, before starting it again"
        ),
    )


def in_progress(out_dir: Path) -> bool:
    """Whether a live process is running the run in `out_dir` (holds its run lock)."""
    path = Path(out_dir) / RUN_LOCK
    if not path.is_file():
        return False
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
