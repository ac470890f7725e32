"""A site that refuses its own data: what it tells the server, and the record of what it read.

A silo builds its data from the run's config once the server welcomes it. Data that break the run's
agreement (a file that does not decode, a class the run does not name, a missing split, data that
differ from what the site read for this run) are refused by the site itself: it logs the whole
reason, file names included, in its own log, tells the server REFUSE with the *kind* of problem and
the config key it concerns (both from fixed vocabularies: nothing of the site's paths, file or
folder names leaves it), and ends with exit code 2. The server logs which rank refused and why and
goes on waiting for it; the site, fixed and started again, joins.

A site keeps a digest of what it read (`data_digest.json` in its folder: its parties' samples and
labels, train and test, as decoded) from its first task in a run (a run that never began binds no
data); started again in the same run, it refuses itself if its data differ, even with the same
number of samples.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedml_moon.config.schema import ConfigError
from fedml_moon.core.digest import state_dict_sha256
from fedml_moon.core.partition import PartitionError
from fedml_moon.core.split import SplitError
from fedml_moon.data.datasets import DataNotFoundError
from fedml_moon.data.formats import DataFileError
from fedml_moon.distributed.protocol import refusal_text as described  # noqa: F401 (a silo's name)
from fedml_moon.run_folder import RunFolder, read_json, write_text

log = logging.getLogger(__name__)
KEY = re.compile(r"\b([a-z]+_args\.[a-z_]+)\b")  # a setting named in a message
DATA_ERRORS = (ConfigError, DataFileError, DataNotFoundError, PartitionError, SplitError)
"""What building a site's data raises for data the site must refuse (its own log says which file)."""


class DataChanged(ConfigError):
    """The site's data differ from those it read earlier in this run (`data_digest.json`)."""


def kind_of(err: Exception) -> tuple[str, str | None]:
    """(kind, config key) of a refusal, from fixed vocabularies only: the key is the first setting
    the message names (`data_args.classes`; data_cache_dir only where it names no other), or None."""
    if isinstance(err, DataChanged):
        kind = "changed"
    elif isinstance(err, DataNotFoundError):
        kind = "missing"
    elif isinstance(err, DataFileError) or isinstance(err.__context__, DataFileError):  # raised from None
        kind = "unreadable"
    elif isinstance(err, (PartitionError, SplitError)):
        kind = "split"
    else:
        kind = "agreement"
    keys = KEY.findall(str(err))
    named = [k for k in keys if k != "data_args.data_cache_dir"]  # the folder's key: the least telling
    return kind, (named or keys or [None])[0]


def data_digest(arrays: list[torch.Tensor | np.ndarray]) -> str:
    """SHA-256 over `arrays` (each one's dtype, shape and values, in order): what a site read; the
    model digest's (`core.digest.state_dict_sha256`), the arrays named by their place."""
    return state_dict_sha256({f"{i:09d}": torch.as_tensor(a) for i, a in enumerate(arrays)})


def check_digest(folder: Path, digest: str, overwrite: bool) -> None:
    """Refuse data whose digest differs from the one `record_digest` kept in `folder` when this site
    first trained in the run (DataChanged), unless `overwrite` (a new run: `record_digest` replaces it)."""
    path = RunFolder(folder).data_digest
    if overwrite or not path.is_file():
        return
    try:
        recorded = read_json(path).get("sha256")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded != digest:
        raise DataChanged(
            f"data_args.data_cache_dir: the site's data differ from those it read earlier in this run "
            f"({path}: sha256 {str(recorded)[:12]}, now {digest[:12]}); put them back as they were to "
            "rejoin this run. A new run takes other data: start the server afresh (--overwrite, or "
            "another --output-dir), and this site with the same command; it keeps this run's files apart"
        )


def record_digest(folder: Path, digest: str) -> None:
    """Keep `digest` in `folder`/data_digest.json: the data this site trains on in this run (written
    at its first task, so that a run that never began binds no data)."""
    write_text(RunFolder(folder).data_digest, json.dumps({"sha256": digest}) + "\n")


def held_data_digest(fed: Any, parties: list[int]) -> str:
    """`data_digest` of what a worker's `parties` hold in `fed` (a `FederatedData`): each party's
    training samples and labels and its test split (or the run's test set where parties share it)."""
    data, held, arrays = fed.data, set(parties), []
    for i, party in enumerate(fed.ids):
        if party not in held:
            continue
        train = torch.as_tensor(np.asarray(fed.train_parts[i]), dtype=torch.long)
        arrays += [data.x_train[train], data.y_train[train]]
        if fed.test_parts is not None:
            test = torch.as_tensor(np.asarray(fed.test_parts[i]), dtype=torch.long)
            arrays += [data.x_test[test], data.y_test[test]]
    if fed.test_parts is None:
        arrays += [data.x_test, data.y_test]
    return data_digest(arrays)
