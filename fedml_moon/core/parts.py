"""Every party's index array as one flat array and offsets (pure numpy).

A partition of a million parties as a million small arrays costs a Python object each to make, to
count and to write; `Parts` holds them as ``flat`` (every party's indices, party after party) and
``offsets`` (party i's are ``flat[offsets[i]:offsets[i + 1]]``), and is still the sequence of index
arrays the rest of the code indexes (``parts[i]``, ``len(parts)``, ``for part in parts``): party
i's array is a view of ``flat``, made when asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import overload

import numpy as np


class Positions:
    """Party id -> its row in per-party arrays whose rows are the distinct ids `parties`: the id
    itself where they are 0..n-1, else a binary search (no dict of a million entries)."""

    def __init__(self, parties: Sequence[int] | np.ndarray) -> None:
        self.parties = np.asarray(parties, dtype=np.int64).reshape(-1)
        n = len(self.parties)
        self.dense = bool(np.array_equal(self.parties, np.arange(n)))
        self._order = None if self.dense else np.argsort(self.parties, kind="stable")
        self._sorted = None if self._order is None else self.parties[self._order]
        if self._sorted is not None and np.any(np.diff(self._sorted) == 0):
            raise ValueError("parties must be distinct")

    def row(self, party: object) -> int | None:
        """The row of `party`, or None when it is not one of the parties."""
        try:
            p = int(party)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return None
        n = len(self.parties)
        if self._order is None or self._sorted is None:
            return p if 0 <= p < n else None
        i = int(np.searchsorted(self._sorted, p))
        return int(self._order[i]) if i < n and self._sorted[i] == p else None

    def __len__(self) -> int:
        return len(self.parties)


class Sizes(Mapping[int, int]):
    """party -> its number of samples, from the ids `parties` and the array `sizes` (FedML's
    `train_data_local_num_dict`, without a dict entry per party)."""

    def __init__(self, parties: Sequence[int] | np.ndarray, sizes: np.ndarray) -> None:
        self._at, self.sizes = Positions(parties), np.asarray(sizes, dtype=np.int64)

    def __getitem__(self, party: int) -> int:
        row = self._at.row(party)
        if row is None:
            raise KeyError(party)
        return int(self.sizes[row])

    def __contains__(self, party: object) -> bool:
        return self._at.row(party) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self._at.parties.tolist())

    def __len__(self) -> int:
        return len(self._at)


def sizes_of(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Each part's length, int64 [n] (a `Parts`' offsets, without touching its arrays)."""
    if isinstance(parts, Parts):
        return parts.sizes
    return np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))


class Parts(Sequence[np.ndarray]):
    """Parties' int64 index arrays, party i's being ``flat[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        flat, offsets = np.asarray(flat), np.asarray(offsets)
        if flat.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError(
                f"flat and offsets must be 1-D, offsets non-empty; got {flat.shape}, {offsets.shape}"
            )
        if offsets[0] != 0 or offsets[-1] != len(flat) or np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must rise from 0 to len(flat) = {len(flat)}")
        self.flat = flat.astype(np.int64, copy=False)
        self.offsets = offsets.astype(np.int64, copy=False)

    @classmethod
    def of(cls, parts: Sequence[np.ndarray] | Parts) -> Parts:
        """`parts` as `Parts` (itself if it is one): one concatenation of the arrays."""
        if isinstance(parts, Parts):
            return parts
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
        return cls(np.concatenate(arrays) if arrays else np.zeros(0, np.int64), offsets)

    @classmethod
    def cut(cls, flat: np.ndarray, n_parts: int) -> Parts:
        """`flat` cut into `n_parts` near-equal consecutive parts, as `np.array_split` cuts it."""
        base, extra = divmod(len(flat), n_parts)
        sizes = np.full(n_parts, base, dtype=np.int64)
        sizes[:extra] += 1
        return cls(flat, np.concatenate([[0], np.cumsum(sizes)]))

    @property
    def sizes(self) -> np.ndarray:
        """Each party's number of indices, int64 [n_parts]."""
        return np.diff(self.offsets)

    def owners(self) -> np.ndarray:
        """The party of every entry of ``flat``, int64 [len(flat)]."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...
    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"party {i} of {n}")
        return self.flat[self.offsets[j] : self.offsets[j + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[j] for j in range(len(self)))

    def __repr__(self) -> str:
        return f"Parts({len(self)} parties, {len(self.flat)} indices)"
