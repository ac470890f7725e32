"""What every reader of a site's own data returns: each party's training and test split (the whole
site's under the name "" without a natural partition), with labels as indices into the run's classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedml_moon.errors import ConfigError

Split = tuple[torch.Tensor, np.ndarray]  # x [N, C, H, W] (uint8 or float), y int64 [N]
Owned = dict[str, tuple[Split, Split | None]]  # party ("" for the whole site) -> (train, test or None)


def owners(root: Path, natural: bool) -> dict[str, Path]:
    """party -> its folder: with a natural partition every sub-folder of ``root`` (sorted by name, hidden
    ones left out), else the site's whole folder under the name ""."""
    if not natural:
        return {"": root}
    found = {d.name: d for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".")}
    if not found:
        raise ConfigError(
            f"data_args.partition_method: natural reads one folder per party under {root}, which has none; "
            "lay the data out as <party>/<class>/<file> (or <party>/train/..., <party>/test/...)"
        )
    return found


def labels_to_indices(values: Any, classes: list[str], where: str, indices: bool = False) -> np.ndarray:
    """Class names (compared as text) -> int64 indices into ``classes``; with `indices`, ints are
    indices themselves (a plugin's labels). An unknown one is refused, naming it and where it is."""
    index = {c: i for i, c in enumerate(classes)}
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if indices and isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if not 0 <= int(v) < len(classes):
                raise ConfigError(
                    f"data_args.classes: {where}, sample {i}: label {int(v)} is no index into the run's "
                    f"{len(classes)} classes; add the class to data_args.classes or drop the sample"
                )
            out[i] = int(v)
        elif str(v) in index:
            out[i] = index[str(v)]
        else:
            raise ConfigError(
                f"data_args.classes: {where}, sample {i}: class {v!r} is not one the run names "
                f"({', '.join(classes)}); add it to data_args.classes (every site the same list) or drop it"
            )
    return out
