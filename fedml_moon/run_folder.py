"""A run's output folder, spelt in one place: every file and folder name in it, the one atomic write
and the one reader of its records.

The server of a run (or the standalone simulation) writes at the folder's top; each silo (or MPI
worker) in its own `rank-<r>/`, laid out the same way; a hierarchical silo's other processes in
`rank-<r>/process-<k>/`. `RunFolder` names each file of one such folder. A sweep's folder holds its
runs' folders and its job record; the commands that read a finished run (report, replay, t-SNE)
write beside its records.

Standard library only: the commands that only read a folder (`status`, `sweep --status`) import no
PyTorch, and `core` may take its names from here (`core.checkpoint` its `LATEST`, `core.state` its
party files) and its atomic write (`replacing`). No other module of the package spells one of
these names (`tests/test_run_folder.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# a run's own records (the server's, or the simulation's; a silo's are in its rank folder)
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
STATUS = "status.json"
FINAL_MODEL = "final_model.pt"
MODEL_AT = "model_at_{}.pt"  # the model of a run that ended otherwise: model_at_failed.pt, ...
CLAIMS = "claims.json"
ACCURACY_PLOT = "accuracy.png"
PARTITION = "partition.json"
PARTITION_ARRAYS = "partition.npz"
PARTITION_PLOT = "partition.png"
PRIVACY_LEDGER = "privacy_ledger.jsonl"
PARTY_MODELS = "party_models"
PARTY_STATE = "party_state"  # a process's party states, where `core.state` keeps them on disk
PARTY_FILE = "party_{}.pt"  # a party's file in either
CHECKPOINT = "checkpoint"
LATEST = "LATEST"  # in checkpoint/: the newest complete round (`core.checkpoint`: its rounds' folders)
TENSORBOARD = "tensorboard"
WANDB = "wandb"
FEDML_HOME = ".fedml"  # FedML's `~/.fedml`, kept in the run's folder
# a silo's own
RANK = "rank-{}"
PROCESS = "process-{}"
DATA_DIGEST = "data_digest.json"
SECURE_SUMS = "secure_sums.json"  # a silo's: the survivors each of its parties' shares unmasked, per round
RUN = "run.json"  # the run whose files a folder holds: its identity, as the server's WELCOME names it
EARLIER = "earlier"  # in a silo's folder: earlier runs' files, one folder each (`earlier/<run>/`)
# what commands write from a finished run's records
REPORT = "report"
REPLAY = "replay"
TSNE = "tsne.png"
# sweeps: their folder, and what a run of one holds besides its records
OUTPUTS = "outputs"  # where runs and sweeps go unless told
SWEEPS = "sweeps"  # in outputs/
JOBS = "jobs.json"
JOBS_LOCK = ".jobs.lock"
SUBMITIT = ".submitit"
RUN_LOG = "run.log"
JOB = "job.json"
JOB_OUTPUT = "job.out"

RECORDS = (
    METRICS,
    SUMMARY,
    CHECKPOINT,
    FINAL_MODEL,
    CLAIMS,
    PARTY_MODELS,
    ACCURACY_PLOT,
    STATUS,
    TENSORBOARD,
    WANDB,
)
"""What a run's server or simulation writes of its own and `--overwrite` replaces (with its
`model_at_<status>.pt`); a silo's files are under `rank-<r>/`."""


def model_file(status: str) -> str:
    """Where a run that ended with `status` saves its model: final_model.pt only when completed."""
    return FINAL_MODEL if status == "completed" else MODEL_AT.format(status)


@dataclass(frozen=True)
class RunFolder:
    """One process's folder of a run, and where each of its files lives: the run's
    (`RunFolder(out_dir)`), a silo's (`.rank(r)`), a hierarchical silo's other process's
    (`.rank(r).process(k)`)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def rank(self, rank: int) -> RunFolder:
        """Silo (or worker) `rank`'s own folder of this run."""
        return RunFolder(self.root / RANK.format(rank))

    def process(self, index: int) -> RunFolder:
        """Process `index` (1 ... P - 1) of a hierarchical silo whose folder this is."""
        return RunFolder(self.root / PROCESS.format(index))

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def status(self) -> Path:
        return self.root / STATUS

    @property
    def final_model(self) -> Path:
        return self.root / FINAL_MODEL

    def model(self, status: str) -> Path:
        """The model file of a run that ended with `status` (`model_file`)."""
        return self.root / model_file(status)

    def models_at(self) -> list[Path]:
        """The model files of runs that did not complete in the folder (model_at_<status>.pt)."""
        return sorted(self.root.glob(MODEL_AT.format("*")))

    @property
    def claims(self) -> Path:
        return self.root / CLAIMS

    @property
    def accuracy_plot(self) -> Path:
        return self.root / ACCURACY_PLOT

    @property
    def partition(self) -> Path:
        return self.root / PARTITION

    @property
    def partition_arrays(self) -> Path:
        return self.root / PARTITION_ARRAYS

    @property
    def partition_plot(self) -> Path:
        return self.root / PARTITION_PLOT

    @property
    def privacy_ledger(self) -> Path:
        return self.root / PRIVACY_LEDGER

    @property
    def party_models(self) -> Path:
        return self.root / PARTY_MODELS

    def party_model(self, party: int) -> Path:
        """Party `party`'s latest uploaded model (`train_args.save_party_models`)."""
        return self.party_models / PARTY_FILE.format(party)

    @property
    def party_state(self) -> Path:
        return self.root / PARTY_STATE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINT

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST

    @property
    def checkpointed(self) -> bool:
        """Whether the folder holds a complete checkpoint to go on from."""
        return self.latest.is_file()

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def wandb(self) -> Path:
        return self.root / WANDB

    @property
    def fedml_home(self) -> Path:
        return self.root / FEDML_HOME

    @property
    def secure_sums(self) -> Path:
        return self.root / SECURE_SUMS

    @property
    def run(self) -> Path:
        return self.root / RUN

    def earlier(self, run: str) -> Path:
        """Where a silo keeps the files of run `run` once another run has its folder."""
        return self.root / EARLIER / run

    @property
    def data_digest(self) -> Path:
        return self.root / DATA_DIGEST

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def replay(self) -> Path:
        return self.root / REPLAY

    @property
    def tsne(self) -> Path:
        return self.root / TSNE

    @property
    def run_log(self) -> Path:
        return self.root / RUN_LOG

    @property
    def job(self) -> Path:
        return self.root / JOB

    @property
    def job_output(self) -> Path:
        return self.root / JOB_OUTPUT

    @property
    def jobs(self) -> Path:
        """A sweep folder's record of its submissions."""
        return self.root / JOBS


def folder_of(where: Path | RunFolder) -> RunFolder:
    """`where` as a RunFolder (a path names the folder's root)."""
    return where if isinstance(where, RunFolder) else RunFolder(Path(where))


@contextmanager
def replacing(path: Path, tmp: Path | None = None) -> Iterator[Path]:
    """A temporary file beside `path` (its folder made if missing) for the block to write: it
    replaces `path` at once when the block ends, and is removed if the block raises. A reader sees
    the old file or the new one, never a part.

    The temporary file is `.<name>.tmp` unless `tmp` names another in the same folder: PyTorch names
    an archive's records after the file it writes, so a model's bytes depend on that name."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp") if tmp is None else Path(tmp)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` at once (`replacing`)."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_json(path: Path, value: Any, **dumps: Any) -> None:
    """Replace `path` with `value` as JSON (`json.dumps` with `dumps`) at once (`replacing`)."""
    write_text(path, json.dumps(value, **dumps))


_RAISE: Any = object()


def read_json(path: Path, default: Any = _RAISE) -> Any:
    """The JSON value in `path`; where it is missing or not JSON, `default`, or without one the error
    (OSError, ValueError)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        if default is _RAISE:
            raise
        return default


def read_records(where: Path | RunFolder) -> list[dict[str, Any]]:
    """The round records of the folder `where` (its metrics.jsonl), in order; [] where there are
    none. Blank lines are skipped, and a line that is not JSON ends them: the last line, being
    written while the file is read, is left out until it is whole."""
    try:
        lines = folder_of(where).metrics.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return out
