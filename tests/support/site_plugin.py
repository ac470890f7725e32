"""A dataset plugin (`data_args.plugin`), as a site would write one: torch Datasets of its own."""

from __future__ import annotations

import torch
from PIL import Image
from torch.utils.data import Dataset

from tests.support.site_data import CLASSES, MIXES, fashion


class Pictures(Dataset):
    """PIL images and class names, as torchvision-style datasets give them."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return Image.fromarray(self.x[i], mode="L"), CLASSES[int(self.y[i])]


def load(data_args) -> tuple[Dataset, Dataset]:
    """The site's train and test sets: PIL images and names for training, tensors and indices for testing."""
    x, y, xt, yt = fashion(400, 150)
    test = torch.utils.data.TensorDataset(torch.from_numpy(xt[:, None]), torch.from_numpy(yt))
    return Pictures(x, y), test


def parties(data_args) -> dict[str, tuple[Dataset, None]]:
    """One Dataset per party (a natural partition), no test sets (a seeded share is kept back)."""
    out = {}
    for k, (name, keep) in enumerate(MIXES.items()):
        x, y, _, _ = fashion(200, 1, offset=200 * k)
        mask = [int(c) in keep for c in y]
        out[name] = (Pictures(x[mask], y[mask]), None)
    return out


def wrong_shape(data_args) -> tuple[Dataset, Dataset]:
    """Tensors of 32x32 where the run agrees on 28x28."""
    x = torch.zeros(20, 1, 32, 32, dtype=torch.uint8)
    ds = torch.utils.data.TensorDataset(x, torch.zeros(20, dtype=torch.int64))
    return ds, ds
