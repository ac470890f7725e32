"""A partition as a file: each party's training and local-test indices, so that a run can take the
split another run (or another code) drew.

Every run writes two files: `partition.json`, small, that says what the split is of, and beside it
`partition.npz` (numpy's uncompressed archive, `np.load` reads it), whose columns hold every party's
indices, one flat array and its offsets a split, so a million parties are a few arrays, not a
million lists:

    partition.json  {"format": 2, "dataset": "fashion-mnist", "n_train": 60000, "n_test": 10000,
                     "n_parties": 10, "arrays": "partition.npz", "parties": [...], "party_ids": [...]}
    partition.npz   train_indices  int64, every party's training indices, party 0's first
                    train_offsets  int64 [n_parties + 1]: party i's are train_indices[off[i]:off[i + 1]]
                    test_indices, test_offsets   the same for the local test splits
                    counts         int64 [n_parties, classes]: training samples per party and class

`data_args.partition_method: file` with `data_args.partition_path` naming a `partition.json` reads
either this form or the older one, a single JSON with the indices as lists:

    {"dataset": "fashion-mnist", "n_train": 60000, "n_test": 10000,
     "train": [[party 0's training indices], ...], "test": [[party 0's local-test indices], ...]}

The indices point into the data as the run loads them: the data set's own order, or the subset
`max_train_samples` / `max_test_samples` draw (pure numpy, no FedML). `counts`, `parties` (a natural
partition's names) and `party_ids` (a silo's own parties) are written for people and ignored on
reading; `dataset`, `n_train` and `n_test`, where present, must match the data.
"""

from __future__ import annotations

import json
import logging
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedml_moon.config.schema import ConfigError
from fedml_moon.core.parts import Parts
from fedml_moon.data.holdings import Holdings
from fedml_moon.run_folder import PARTITION_ARRAYS, RunFolder

log = logging.getLogger(__name__)
KEY = "data_args.partition_path"
COLUMNS = ("train_indices", "train_offsets", "test_indices", "test_offsets")


@dataclass
class PartitionFile:
    """A partition file read (either form): each party's `train` and `test` indices, its training
    `counts` per class where the file holds them, and the rest of `partition.json` (`meta`)."""

    train: Parts
    test: Parts
    counts: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def write_partition(
    out_dir: Path, data: Holdings, train: Any, test: Any, counts: np.ndarray, **extra: Any
) -> Path:
    """`partition.npz` (the columns) and then `partition.json` (what they are of, and `extra`:
    `parties`, `party_ids`) in `out_dir`; returns the JSON's path."""
    train, test = Parts.of(train), Parts.of(test)
    columns = {"train_indices": train.flat, "train_offsets": train.offsets}
    columns |= {
        "test_indices": test.flat,
        "test_offsets": test.offsets,
        "counts": np.asarray(counts, np.int64),
    }
    folder = RunFolder(out_dir)
    with open(folder.partition_arrays, "wb") as f:
        np.savez(f, **columns)
    meta = {"format": 2, "dataset": data.name, "n_train": len(data.y_train), "n_test": len(data.y_test)}
    meta |= {"n_parties": len(train), "arrays": PARTITION_ARRAYS, **extra}
    path = folder.partition
    path.write_text(json.dumps(meta))
    return path


def load_partition_file(path: str | Path) -> PartitionFile:
    """The partition in `path` (a `partition.json`, either form), its shape checked; a ConfigError
    naming what is wrong when it is not one."""
    path = Path(path).expanduser()
    record = _json(path)
    if "arrays" in record:
        return _columns(path, record)
    missing = [k for k in ("train", "test") if k not in record]
    if missing:
        raise ConfigError(
            f"{KEY}: {path} has no {' or '.join(missing)} indices (a partition.json written before they "
            "were recorded holds counts only); give one with each party's train and test index lists"
        )
    if not isinstance(record["train"], list) or not isinstance(record["test"], list):
        raise ConfigError(f"{KEY}: {path}: train and test must be lists (one index list per party)")
    _same_parties(path, len(record["train"]), len(record["test"]))
    train = Parts.of([_listed(record["train"], p, "train", path) for p in range(len(record["train"]))])
    test = Parts.of([_listed(record["test"], p, "test", path) for p in range(len(record["test"]))])
    counts = record.get("counts")
    meta = {k: v for k, v in record.items() if k not in ("train", "test", "counts")}
    return PartitionFile(train, test, None if counts is None else np.asarray(counts), meta)


def read_partition(path: str, data: Holdings, n_parties: int) -> tuple[Parts, Parts]:
    """The training and local-test index arrays of every party, from a `partition.json`; a
    ConfigError naming what is wrong (and nothing else is read) when the file does not fit the run."""
    read = load_partition_file(path)
    ids, n_file = read.meta.get("party_ids"), len(read.train)
    if ids is not None and ids != list(range(n_file)):
        raise ConfigError(
            f"{KEY}: {path} is one silo's partition (its parties {ids[:5]}); give the partition.json "
            "of a run that partitioned the data for every party"
        )
    for key, actual in (("dataset", data.name), ("n_train", len(data.y_train)), ("n_test", len(data.y_test))):
        if key in read.meta and read.meta[key] != actual:
            raise ConfigError(
                f"{KEY}: {path} was drawn on {key} {read.meta[key]!r}, the data loaded here have {actual!r}; "
                "use the data_args the file was written with (the same dataset, max_train_samples and "
                "max_test_samples)"
            )
    if n_file != n_parties:
        raise ConfigError(
            f"train_args.client_num_in_total: {n_parties}, but {path} holds {n_file} parties; "
            f"set client_num_in_total: {n_file}"
        )
    _check(read.train, len(data.y_train), "train", path)
    _check(read.test, len(data.y_test), "test", path)
    empty = np.flatnonzero(read.train.sizes == 0)
    if empty.size:
        raise ConfigError(f"{KEY}: party {empty[0]} has no training sample in {path}; every party needs one")
    _note_overlaps(read.train, path)
    return read.train, read.test


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{KEY}: {path} does not exist; give the partition.json a run wrote")
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{KEY}: {path} is not JSON ({err}); give the partition.json a run wrote") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{KEY}: {path} has no train or test indices; give the partition.json a run wrote")
    return record


def _same_parties(path: Path, n_train: int, n_test: int) -> None:
    if n_train != n_test:
        raise ConfigError(
            f"{KEY}: {path} holds {n_train} parties' train indices but {n_test} parties' test indices; "
            "both need one list per party"
        )


def _columns(path: Path, record: dict[str, Any]) -> PartitionFile:
    """The columnar form: `record["arrays"]`, a file beside `path`, holds `COLUMNS` (and `counts`)."""
    name = record["arrays"]
    if not isinstance(name, str) or Path(name).name != name:
        raise ConfigError(
            f"{KEY}: {path}: arrays must name a file beside it (such as {PARTITION_ARRAYS!r}); got {name!r}"
        )
    where = path.parent / name
    if not where.is_file():
        raise ConfigError(
            f"{KEY}: {path} names its arrays {where}, which does not exist; keep the two files together"
        )
    try:
        with np.load(where, allow_pickle=False) as npz:
            missing = [c for c in COLUMNS if c not in npz.files]
            arrays = {c: npz[c] for c in (*COLUMNS, "counts") if c in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ConfigError(
            f"{KEY}: {where} is not a numpy .npz archive ({err}); give the one a run wrote"
        ) from None
    if missing:
        raise ConfigError(
            f"{KEY}: {where} lacks {', '.join(missing)}; it needs the columns {', '.join(COLUMNS)}"
        )
    parts = {split: _parts(arrays, split, where) for split in ("train", "test")}
    _same_parties(path, len(parts["train"]), len(parts["test"]))
    meta = {k: v for k, v in record.items() if k != "arrays"}
    return PartitionFile(parts["train"], parts["test"], arrays.get("counts"), meta)


def _parts(arrays: dict[str, np.ndarray], split: str, where: Path) -> Parts:
    flat, offsets = arrays[f"{split}_indices"], arrays[f"{split}_offsets"]
    for name, a in ((f"{split}_indices", flat), (f"{split}_offsets", offsets)):
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise ConfigError(f"{KEY}: {where}: {name} must be a 1-D integer array; got {a.dtype} {a.shape}")
    try:
        return Parts(flat, offsets)
    except ValueError as err:
        raise ConfigError(f"{KEY}: {where}: {split}_offsets: {err}") from None


def _listed(parts: list, party: int, split: str, path: Path) -> np.ndarray:
    """Party `party`'s index list of `split` in the JSON form: a list of integers."""
    values = parts[party]
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ConfigError(f"{KEY}: {path}: party {party}'s {split} indices must be a list of integers")
    return np.asarray(values, dtype=np.int64)


def _check(parts: Parts, size: int, split: str, path: str) -> None:
    """Every party's indices of `split` in [0, size), none twice within a party (whole arrays at once)."""
    flat = parts.flat
    outside = np.flatnonzero((flat < 0) | (flat >= size))
    if outside.size:
        party = int(np.searchsorted(parts.offsets, outside[0], side="right") - 1)
        raise ConfigError(
            f"{KEY}: {path}: party {party}'s {split} index {int(flat[outside[0]])} is outside the {size} "
            f"{split} samples loaded; use the data_args the file was written with"
        )
    keys = np.sort(parts.owners() * max(size, 1) + flat)
    twice = np.flatnonzero(keys[1:] == keys[:-1])
    if twice.size:
        party = int(keys[twice[0]] // max(size, 1))
        raise ConfigError(f"{KEY}: {path}: party {party}'s {split} indices name a sample twice")


def _note_overlaps(train: Parts, path: str) -> None:
    """Parties may share training samples (another code's split may); say so once."""
    distinct = len(np.unique(train.flat))
    if distinct < len(train.flat):
        log.warning(
            "%s: %d training samples are held by more than one party", path, len(train.flat) - distinct
        )
