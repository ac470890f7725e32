"""In-memory batch iterators over a party's samples and FedML's 8-element dataset list."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from fedml_moon.core.parts import Sizes, sizes_of
from fedml_moon.data import lazy
from fedml_moon.data.augment import Draw, apply, draw, join
from fedml_moon.data.holdings import Holdings

logger = logging.getLogger(__name__)


class Plan(NamedTuple):
    """One batch, before it is made: the sample indices [B] (on the images' device) and the
    augmentation's random draws. `materialize` turns one plan, or several loaders' plans at once, into
    tensors."""

    idx: torch.Tensor
    drawn: Draw | None


class FedMLDataset(NamedTuple):
    """FedML's positional 8-element dataset, with names: what `FedMLRunner` and FedML's trainers take
    (a tuple, so FedML's own code indexes it as before); the plugin reads it by name only."""

    train_data_num: int
    test_data_num: int
    train_data_global: PartyLoader
    test_data_global: PartyLoader
    train_data_local_num_dict: dict[int, int]
    train_data_local_dict: Mapping[int, PartyLoader]
    test_data_local_dict: Mapping[int, PartyLoader]
    class_num: int


def _party_seed(seed: int, party_id: int | None) -> int:
    """63-bit generator seed mixed from the run seed and the party (None for global loaders)."""
    words = [seed % (1 << 64), 0 if party_id is None else party_id + 1]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0]) >> 1


class PartyLoader:
    """Iterable of ``(x, y)`` batches over the samples ``indices`` of shared in-memory ``images``.

    Each ``iter()`` is one epoch: the order is reshuffled (when ``shuffle``) with the loader's own
    generator, seeded from ``seed`` and ``party_id``, so epochs differ from each other while the whole
    sequence is reproducible. A batch is ``x = (augment(images[idx] / 255) - mean) / std`` (uint8 images;
    floating-point values without the / 255) float32
    (float64 under train_args.precision fp64) [B, C, H, W] and ``y = labels[idx]`` int64 [B], both on
    ``device``.

    With ``drop_last`` the incomplete final batch is dropped, except when the party holds fewer than
    ``batch_size`` samples: then one smaller batch with all of them is yielded instead of nothing.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        indices: np.ndarray | torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        mean: Sequence[float] = (0.0,),
        std: Sequence[float] = (1.0,),
        augment: str = "none",
        seed: int = 0,
        party_id: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.images = images
        self.labels = labels
        if isinstance(indices, torch.Tensor):  # e.g. another loader's, already on the device (`plain`)
            self.indices = indices.to(device=images.device, dtype=torch.int64)
        else:
            self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64)).to(images.device)
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.augment = augment
        self.party_id = party_id
        self.num_samples = int(self.indices.numel())
        self.device = torch.device(device) if device is not None else images.device
        self._norm = (tuple(float(m) for m in mean), tuple(float(d) for d in std))  # as given, on the host
        dtype = torch.get_default_dtype()  # float32, or float64 under train_args.precision: fp64
        self._mean = torch.tensor(mean, dtype=dtype).view(1, -1, 1, 1).to(self.device)
        self._std = torch.tensor(std, dtype=dtype).view(1, -1, 1, 1).to(self.device)
        where = images.device if images.device.type == "cuda" else torch.device("cpu")
        self.generator = torch.Generator(device=where).manual_seed(_party_seed(seed, party_id))

    def __len__(self) -> int:
        """Number of batches in one epoch."""
        if self.drop_last and self.num_samples >= self.batch_size:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def plans(self) -> Iterator[Plan]:
        """One epoch of batch plans: the order (reshuffled when ``shuffle``) and each batch's
        augmentation draws, from the loader's generator, which lives where the images do (on a GPU
        nothing of this reaches the host)."""
        order = self.indices
        if self.shuffle:
            gen = self.generator
            order = order[torch.randperm(self.num_samples, generator=gen, device=gen.device).to(order.device)]
        order = order.to(self.images.device)  # once per epoch: batches are gathered where the images are
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield Plan(idx, draw(self.augment, int(idx.numel()), self.generator))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for plan in self.plans():
            yield self._batch(plan.idx, plan.drawn)

    def _batch(self, idx: torch.Tensor, drawn: Draw | None) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(self.images.device)
        x = self.images[idx].to(self.device).to(self._mean.dtype)
        if self.images.dtype == torch.uint8:  # images; floating-point values are used as they are
            x.div_(255.0)
        x = apply(x, self.augment, drawn)
        x = (x - self._mean) / self._std  # both on self.device: no copy per batch
        y = self.labels[idx.to(self.labels.device)].to(self.device)
        return x, y

    def shares_data(self, other: PartyLoader) -> bool:
        """Whether `other` makes its batches from the same images the same way (so the two loaders'
        batches can be made as one)."""
        return (
            other.images is self.images
            and other.labels is self.labels
            and other.augment == self.augment
            and other.device == self.device
            and other._norm == self._norm
        )

    def plain(self, batch_size: int = 256) -> PartyLoader:
        """The same samples in a fixed order, without augmentation or dropping (for statistics)."""
        mean, std = self._norm
        return PartyLoader(
            self.images,
            self.labels,
            self.indices,
            batch_size,
            mean=mean,
            std=std,
            party_id=self.party_id,
            device=self.device,
        )

    def to(self, device: torch.device | str) -> PartyLoader:
        """Yield batches on ``device`` from now on; returns ``self``."""
        self.device = torch.device(device)
        self._mean, self._std = self._mean.to(self.device), self._std.to(self.device)
        return self

    @property
    def targets(self) -> torch.Tensor:
        """Labels of this loader's samples, int64 [num_samples], in ``indices`` order."""
        return self.labels[self.indices.to(self.labels.device)]

    def class_counts(self, num_classes: int) -> torch.Tensor:
        """Samples per class, int64 [num_classes]."""
        return torch.bincount(self.targets.cpu(), minlength=num_classes)[:num_classes]

    def __repr__(self) -> str:
        return (
            f"PartyLoader(party_id={self.party_id}, num_samples={self.num_samples}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, augment={self.augment!r})"
        )


def materialize(loaders: list[PartyLoader], plans: list[Plan]) -> tuple[torch.Tensor, torch.Tensor]:
    """Several loaders' next batches, all of one size B, made as one stacked batch: x [K,B,C,H,W],
    y [K,B]. Loaders that share their images (`shares_data`) gather, augment and normalise their K
    batches in single operations; the result equals making each batch alone, element for element."""
    first = loaders[0]
    if all(first.shares_data(other) for other in loaders[1:]):
        k, b = len(plans), int(plans[0].idx.numel())
        x, y = first._batch(torch.cat([p.idx for p in plans]), join([p.drawn for p in plans]))
        return x.view(k, b, *x.shape[1:]), y.view(k, b)
    made = [ld._batch(p.idx, p.drawn) for ld, p in zip(loaders, plans, strict=True)]
    return torch.stack([m[0] for m in made]), torch.stack([m[1] for m in made])


def build_fedml_dataset(
    data: Holdings,
    train_parts: list[np.ndarray],
    test_parts: list[np.ndarray] | None,
    batch_size: int,
    seed: int,
    drop_last: bool = True,
    eval_batch_size: int = 256,
    device: torch.device | str | None = None,
    resident: bool = False,
    party_ids: list[int] | None = None,
    keep: int | None = None,
) -> FedMLDataset:
    """FedML's dataset for parties ``0..len(train_parts)-1``, or ``party_ids`` (a silo's own party; a
    server with no data none) (a `FedMLDataset`). Local train
    loaders shuffle, augment and honour ``drop_last``; test and global loaders use ``eval_batch_size``
    in fixed order without augmentation. With ``test_parts=None`` every party is evaluated on the
    global test loader.

    ``device`` (default: where the images are) is where every loader, and every loader derived from
    one (``plain()``), yields its batches: the one place a run's training device reaches the data.
    With ``resident`` the images and labels are copied to ``device`` once (uint8), so batches are
    gathered, scaled and augmented there, without a copy from the host per batch.

    The parties' loaders are made when a party is asked for (`data.lazy.PartyLoaders`, holding the
    ``keep`` most recent, default `data.lazy.KEEP`), so start-up and memory grow with the parties
    sampled, not with the parties.
    """
    if resident and device is not None:
        data = dataclasses.replace(
            data,
            x_train=data.x_train.to(device),
            y_train=data.y_train.to(device),
            x_test=data.x_test.to(device),
            y_test=data.y_test.to(device),
        )
    if test_parts is not None and len(test_parts) != len(train_parts):
        raise ValueError(f"{len(train_parts)} train parts but {len(test_parts)} test parts")
    norm = {"mean": data.mean, "std": data.std, "device": device}
    n_train, n_test = len(data.y_train), len(data.y_test)
    train_global = PartyLoader(data.x_train, data.y_train, np.arange(n_train), eval_batch_size, **norm)
    test_global = PartyLoader(data.x_test, data.y_test, np.arange(n_test), eval_batch_size, **norm)
    keep = lazy.KEEP if keep is None else keep
    ids = list(range(len(train_parts))) if party_ids is None else [int(p) for p in party_ids]
    local = {"batch_size": batch_size, "shuffle": True, "drop_last": drop_last, "augment": data.augment}

    def train_loader(i: int, pid: int) -> PartyLoader:
        images, labels = data.x_train, data.y_train
        return PartyLoader(images, labels, train_parts[i], seed=seed, party_id=pid, **local, **norm)

    def test_loader(i: int, pid: int) -> PartyLoader:
        assert test_parts is not None
        return PartyLoader(data.x_test, data.y_test, test_parts[i], eval_batch_size, party_id=pid, **norm)

    if len(ids) != len(train_parts):
        raise ValueError(f"{len(ids)} party ids for {len(train_parts)} train parts")
    sizes = sizes_of(train_parts)
    num_dict = Sizes(ids, sizes)  # party -> its training samples (no dict entry per party)
    train_local: Mapping[int, PartyLoader] = lazy.PartyLoaders(ids, train_loader, keep)
    if test_parts is None:
        test_local: Mapping[int, PartyLoader] = dict.fromkeys(ids, test_global)
    else:
        test_local = lazy.PartyLoaders(ids, test_loader, keep)
    shown = (
        sizes.tolist()
        if len(sizes) <= 100
        else f"from {sizes.min()} to {sizes.max()} (partition.json has each)"
    )
    logger.info("%d parties, local train sizes %s", len(train_parts), shown)
    return FedMLDataset(
        n_train, n_test, train_global, test_global, num_dict, train_local, test_local, data.num_classes
    )
