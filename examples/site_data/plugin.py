"""A dataset plugin (`data_args.plugin: examples/site_data/plugin.py:load`): a site whose images sit
in one NumPy file, ``images.npz`` in its `data_args.data_cache_dir`, handed to the run as torch
Datasets. Any code that yields ``(image, label)`` pairs will do: a PIL image or a [C, H, W] tensor
(uint8 pixels, or floats used as they are), and a class name of `data_args.classes` or its index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset


def load(data_args) -> tuple[Dataset, Dataset | None]:
    """The site's training and test Datasets (return None for the test set to keep a seeded share)."""
    with np.load(Path(data_args.data_cache_dir) / "images.npz") as arrays:
        x_train, y_train = torch.from_numpy(arrays["x_train"]), torch.from_numpy(arrays["y_train"])
        x_test, y_test = torch.from_numpy(arrays["x_test"]), torch.from_numpy(arrays["y_test"])
    return TensorDataset(x_train[:, None], y_train), TensorDataset(x_test[:, None], y_test)
