"""What a site holds: the one type every reader of the data room produces.

A public benchmark (Fashion-MNIST, CIFAR, ...) read whole, an image folder, a table, a Hugging Face
dataset or a plugin's datasets: each becomes a `Holdings`, its training and test samples in memory
with the class names and input shape they agree to. Its `parties`, when the data come split by
their owners (one folder or one value of a party column each: a natural partition), are the
parties' holdings; otherwise a seeded partition (Dirichlet, IID, shards) makes them
(`data.federated.partition`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Parties:
    """A natural partition: party i (named ``names[i]``, in sorted order) holds the training samples
    ``train[i]`` and the test samples ``test[i]`` (int64 index arrays into the holdings' tensors)."""

    names: tuple[str, ...]
    train: list[np.ndarray]
    test: list[np.ndarray]


@dataclass
class Holdings:
    """A data set in memory, with what it agrees to.

    ``x_train`` / ``x_test`` are [N, C, H, W]: uint8 images (batches are scaled by 1/255, then
    normalised with ``mean``/``std`` per channel) or floating-point values (a table's features, a
    plugin's float tensors: normalised as they are); labels are int64 [N], indices into ``classes``.
    ``augment`` names the training augmentation (see ``augment_batch``); ``parties`` is the natural
    partition, if the data came with one.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: str
    classes: tuple[str, ...] = field(default=())
    parties: Parties | None = None

    def __post_init__(self) -> None:
        if not self.classes:
            self.classes = tuple(str(i) for i in range(self.num_classes))

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)
