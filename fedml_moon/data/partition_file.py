"""A partition as a file: each party's training and local-test indices, so that a run can take the
split another run (or another code) drew.

Every run writes `partition.json` in this form; `data_args.partition_method: file` with
`data_args.partition_path` reads one. The indices point into the data as the run loads them: the
data set's own order, or the subset `max_train_samples` / `max_test_samples` draw (pure numpy, no
FedML).

    {"dataset": "fashion-mnist", "n_train": 60000, "n_test": 10000,
     "train": [[party 0's training indices], ...], "test": [[party 0's local-test indices], ...],
     "counts": [[party 0's training samples per class], ...], "parties": [...], "party_ids": [...]}

`counts`, `parties` (a natural partition's names) and `party_ids` (a silo's own parties) are
written for people and ignored on reading; `dataset`, `n_train` and `n_test`, where present, must
match the data.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from fedml_moon.config_schema import ConfigError
from fedml_moon.data.holdings import Holdings

log = logging.getLogger(__name__)
KEY = "data_args.partition_path"


def partition_record(
    data: Holdings, train: list[np.ndarray], test: list[np.ndarray], counts: np.ndarray
) -> dict[str, Any]:
    """What `partition.json` holds (see the module docstring), without `parties` / `party_ids`."""
    return {
        "dataset": data.name,
        "n_train": len(data.y_train),
        "n_test": len(data.y_test),
        "counts": counts.tolist(),
        "train": [np.asarray(part, dtype=np.int64).tolist() for part in train],
        "test": [np.asarray(part, dtype=np.int64).tolist() for part in test],
    }


def read_partition(path: str, data: Holdings, n_parties: int) -> tuple[list, list]:
    """The training and local-test index arrays of every party, from a `partition.json`; a
    ConfigError naming what is wrong (and nothing else is read) when the file does not fit the run."""
    record = _load(Path(path).expanduser())
    ids = record.get("party_ids")
    if ids is not None and ids != list(range(len(record["train"]))):
        raise ConfigError(
            f"{KEY}: {path} is one silo's partition (its parties {ids[:5]}); give the partition.json "
            "of a run that partitioned the data for every party"
        )
    for key, actual in (("dataset", data.name), ("n_train", len(data.y_train)), ("n_test", len(data.y_test))):
        if key in record and record[key] != actual:
            raise ConfigError(
                f"{KEY}: {path} was drawn on {key} {record[key]!r}, the data loaded here have {actual!r}; "
                "use the data_args the file was written with (the same dataset, max_train_samples and "
                "max_test_samples)"
            )
    if len(record["train"]) != n_parties:
        raise ConfigError(
            f"train_args.client_num_in_total: {n_parties}, but {path} holds {len(record['train'])} "
            f"parties; set client_num_in_total: {len(record['train'])}"
        )
    train = [_indices(record["train"], p, len(data.y_train), "train", path) for p in range(n_parties)]
    test = [_indices(record["test"], p, len(data.y_test), "test", path) for p in range(n_parties)]
    for party, part in enumerate(train):
        if len(part) == 0:
            raise ConfigError(f"{KEY}: party {party} has no training sample in {path}; every party needs one")
    _note_overlaps(train, path)
    return train, test


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{KEY}: {path} does not exist; give the partition.json a run wrote")
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{KEY}: {path} is not JSON ({err}); give the partition.json a run wrote") from None
    missing = [k for k in ("train", "test") if not isinstance(record, dict) or k not in record]
    if missing:
        raise ConfigError(
            f"{KEY}: {path} has no {' or '.join(missing)} indices (a partition.json written before they "
            "were recorded holds counts only); give one with each party's train and test index lists"
        )
    if not isinstance(record["train"], list) or not isinstance(record["test"], list):
        raise ConfigError(f"{KEY}: {path}: train and test must be lists (one index list per party)")
    if len(record["test"]) != len(record["train"]):
        raise ConfigError(
            f"{KEY}: {path} holds {len(record['train'])} parties' train indices but "
            f"{len(record['test'])} parties' test indices; both need one list per party"
        )
    return record


def _indices(parts: list, party: int, size: int, split: str, path: str) -> np.ndarray:
    """Party `party`'s index list of `split`, checked: integers in [0, size), none twice."""
    values = parts[party]
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ConfigError(f"{KEY}: {path}: party {party}'s {split} indices must be a list of integers")
    part = np.asarray(values, dtype=np.int64)
    if part.size and (part.min() < 0 or part.max() >= size):
        bad = int(part[(part < 0) | (part >= size)][0])
        raise ConfigError(
            f"{KEY}: {path}: party {party}'s {split} index {bad} is outside the {size} {split} samples "
            "loaded; use the data_args the file was written with"
        )
    if len(np.unique(part)) != len(part):
        raise ConfigError(f"{KEY}: {path}: party {party}'s {split} indices name a sample twice")
    return part


def _note_overlaps(train: list[np.ndarray], path: str) -> None:
    """Parties may share training samples (another code's split may); say so once."""
    total = sum(len(p) for p in train)
    distinct = len(np.unique(np.concatenate(train)))
    if distinct < total:
        log.warning("%s: %d training samples are held by more than one party", path, total - distinct)
