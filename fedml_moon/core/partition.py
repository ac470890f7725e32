"""Splitting a labelled data set among federated parties.

* ``dirichlet_partition``: label-skew split of the MOON / NIID-Bench code (per class, a Dirichlet(beta)
  share for every party, with a cap on parties that already hold their fair share).
* ``iid_partition``: uniform random split.
* ``shard_partition`` / ``class_matched_partition``: LG-FedAvg's "k classes per party" split of the
  training set and the matching split of the test set.

All functions are deterministic given ``seed`` (an int, or a ``numpy.random.SeedSequence`` for a
derived stream, see `fedml_moon.core.seeds`) and return int64 index arrays into ``labels``
(``iid_partition`` as one flat array, `core.parts.Parts`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from fedml_moon.core.parts import Parts

Seed = int | np.random.SeedSequence

logger = logging.getLogger(__name__)

MAX_DIRICHLET_TRIES = 1000


class PartitionError(ValueError):
    """A requested partition cannot be built from the given data."""


def _as_labels(labels: np.ndarray) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise PartitionError(f"labels must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PartitionError(f"labels must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _check_parties(n_parties: int) -> None:
    if n_parties < 1:
        raise PartitionError(f"n_parties must be >= 1, got {n_parties}")


def _dirichlet_draw(
    labels: np.ndarray, classes: np.ndarray, n_parties: int, beta: float, rng: np.random.Generator
) -> list[list[int]]:
    """One pass over the classes of the MOON authors' loop; returns the per-party index lists."""
    n = len(labels)
    idx_batch: list[list[int]] = [[] for _ in range(n_parties)]
    for k in classes:
        idx_k = np.flatnonzero(labels == k)
        rng.shuffle(idx_k)
        p = rng.dirichlet(np.repeat(beta, n_parties))
        p = np.array([pj * (len(idx_j) < n / n_parties) for pj, idx_j in zip(p, idx_batch, strict=True)])
        cum = np.cumsum(p)
        if not np.isfinite(cum[-1]) or cum[-1] <= 0:
            return [[] for _ in range(n_parties)]
        cuts = (cum / cum[-1] * len(idx_k)).astype(int)[:-1]
        for idx_j, piece in zip(idx_batch, np.split(idx_k, cuts), strict=True):
            idx_j.extend(piece.tolist())
    return idx_batch


def dirichlet_partition(
    labels: np.ndarray, n_parties: int, beta: float, seed: Seed, min_size: int = 10
) -> list[np.ndarray]:
    """Label-skewed split: party shares of every class drawn from Dirichlet(beta), as in MOON's code.

    The proportions are normalised through their cumulative sum, so a party at its cap gets exactly
    nothing (MOON's ``p / p.sum()`` can leave a capped last party one sample by float rounding).

    Args:
        labels: int class labels [N].
        n_parties: number of parties.
        beta: Dirichlet concentration; smaller means more skewed.
        seed: seed of ``np.random.default_rng``.
        min_size: the split is redrawn until every party holds at least this many samples.

    Returns:
        ``n_parties`` disjoint int64 index arrays (each shuffled) whose union is ``arange(N)``.

    Raises:
        PartitionError: when ``n_parties * min_size > N`` or no valid draw appears in
            ``MAX_DIRICHLET_TRIES`` tries.
    """
    y = _as_labels(labels)
    _check_parties(n_parties)
    if not beta > 0:
        raise PartitionError(f"beta must be > 0, got {beta}")
    if n_parties * min_size > len(y):
        raise PartitionError(
            f"{n_parties} parties with at least {min_size} samples each need {n_parties * min_size} "
            f"samples, but only {len(y)} are available; use fewer parties or a smaller min_size"
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    for attempt in range(1, MAX_DIRICHLET_TRIES + 1):
        idx_batch = _dirichlet_draw(y, classes, n_parties, beta, rng)
        if min(len(idx_j) for idx_j in idx_batch) >= min_size:
            logger.debug("dirichlet partition found after %d draw(s)", attempt)
            parts = [np.asarray(idx_j, dtype=np.int64) for idx_j in idx_batch]
            for part in parts:
                rng.shuffle(part)
            return parts
    raise PartitionError(
        f"no Dirichlet(beta={beta}) split of {len(y)} samples gave all {n_parties} parties at least "
        f"{min_size} samples in {MAX_DIRICHLET_TRIES} draws; there are too many parties for the data "
        f"or beta is too small"
    )


def iid_partition(n_samples: int, n_parties: int, seed: Seed) -> Parts:
    """Uniform split: a random permutation of ``arange(n_samples)`` cut into near-equal int64 parts
    (as `np.array_split` cuts it), held as one flat array (`Parts`)."""
    _check_parties(n_parties)
    if n_samples < n_parties:
        raise PartitionError(f"cannot split {n_samples} samples among {n_parties} parties")
    perm = np.random.default_rng(seed).permutation(n_samples).astype(np.int64)
    return Parts.cut(perm, n_parties)


def _class_shards(labels: np.ndarray, cls: int, n_shards: int, rng: np.random.Generator) -> list[np.ndarray]:
    idx = np.flatnonzero(labels == cls).astype(np.int64)
    rng.shuffle(idx)
    return list(np.array_split(idx, n_shards))


def _take_shards(
    shards: dict[int, list[np.ndarray]], party_classes: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Every party takes, for each entry of its row, a random not-yet-used shard of that class."""
    parts = []
    for row in party_classes:
        pieces = [shards[int(c)].pop(int(rng.integers(len(shards[int(c)])))) for c in row]
        parts.append(np.concatenate(pieces).astype(np.int64) if pieces else np.empty(0, np.int64))
    return parts


def shard_partition(
    labels: np.ndarray, n_parties: int, shards_per_party: int, seed: Seed
) -> tuple[list[np.ndarray], np.ndarray]:
    """LG-FedAvg's pathological non-IID split: each party gets ``shards_per_party`` class shards.

    Every class is cut into ``n_parties * shards_per_party / C`` shards; the multiset of shard labels
    is shuffled and laid out as ``party_classes`` [n_parties, shards_per_party]. A party can draw two
    shards of the same class, so it holds at most ``shards_per_party`` distinct classes.

    Returns:
        (parts, party_classes): int64 index arrays per party and the class of every shard it holds.
    """
    y = _as_labels(labels)
    _check_parties(n_parties)
    classes = np.unique(y)
    n_shards = n_parties * shards_per_party
    if shards_per_party < 1 or len(classes) == 0 or n_shards % len(classes):
        raise PartitionError(
            f"n_parties * shards_per_party ({n_parties} * {shards_per_party} = {n_shards}) must be a "
            f"positive multiple of the number of classes ({len(classes)}) so that every class is cut "
            f"into the same number of shards"
        )
    per_class = n_shards // len(classes)
    counts = np.bincount(np.searchsorted(classes, y), minlength=len(classes))
    if counts.min() < per_class:
        raise PartitionError(
            f"class {classes[counts.argmin()]} has {counts.min()} samples, fewer than the {per_class} "
            f"shards each class is cut into"
        )
    rng = np.random.default_rng(seed)
    shards = {int(c): _class_shards(y, int(c), per_class, rng) for c in classes}
    flat = np.tile(classes, per_class)
    rng.shuffle(flat)
    party_classes = flat.reshape(n_parties, shards_per_party)
    return _take_shards(shards, party_classes, rng), party_classes


def class_matched_partition(labels: np.ndarray, party_classes: np.ndarray, seed: Seed) -> list[np.ndarray]:
    """Split (test) samples so that each party holds exactly the classes of its ``party_classes`` row.

    Each class is cut into as many shards as it occurs in ``party_classes`` [n_parties, k] and every
    occurrence receives one shard. Samples of classes that occur nowhere are left out.

    Returns:
        int64 index arrays into ``labels``, one per row of ``party_classes``.
    """
    y = _as_labels(labels)
    table = np.asarray(party_classes, dtype=np.int64)
    if table.ndim != 2:
        raise PartitionError(f"party_classes must be 2-D [n_parties, k], got shape {table.shape}")
    rng = np.random.default_rng(seed)
    used, occurrences = np.unique(table, return_counts=True)
    missing = np.setdiff1d(used, y)
    if missing.size:
        logger.warning("classes %s of party_classes have no samples here", missing.tolist())
    shards = {int(c): _class_shards(y, int(c), int(m), rng) for c, m in zip(used, occurrences, strict=True)}
    return _take_shards(shards, table, rng)


def partition_counts(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Samples of every class held by every party: int64 [n_parties, num_classes]."""
    y = _as_labels(labels)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    if not len(parts):
        return np.zeros((0, num_classes), dtype=np.int64)
    flat_parts = Parts.of(parts)
    owner = flat_parts.owners()  # one bincount for every party
    flat = np.bincount(owner * num_classes + y[flat_parts.flat], minlength=len(parts) * num_classes)
    return flat.reshape(len(parts), num_classes)
