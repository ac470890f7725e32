"""Every party's claim as columns: what a server that computed the partition knows of a million
parties, without a dict per party (pure numpy and torch).

`ClaimTable` is the mapping party -> claim (`engine.claims`: ``{"samples", "test_samples",
"classes"}``) that the rest of the server reads, each claim made when asked for from the arrays
``samples``, ``test_samples`` and ``classes`` (bool [n, C], or None where no algorithm shares classes);
`column` gives one field as a mapping, `state` / `from_state` the columns for a checkpoint. `Rows`
is a party's row of a table (its training samples per class) in the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from fedml_moon.core.parts import Positions

FIELDS = ("samples", "test_samples", "classes")


class ClaimTable(Mapping[int, dict[str, Any]]):
    """party -> ``{"samples": int, "test_samples": int, "classes": [int, ...]}`` from columns."""

    def __init__(
        self, parties: np.ndarray, samples: np.ndarray, test_samples: np.ndarray, classes: np.ndarray | None
    ) -> None:
        self._at = Positions(parties)
        self.parties = self._at.parties
        self.samples = np.asarray(samples, dtype=np.int64)
        self.test_samples = np.asarray(test_samples, dtype=np.int64)
        self.classes = None if classes is None else np.asarray(classes, dtype=bool)
        n = len(self.parties)
        if (
            len(self.samples) != n
            or len(self.test_samples) != n
            or (classes is not None and len(classes) != n)
        ):
            raise ValueError(f"every column needs one value per party ({n})")

    @classmethod
    def of(
        cls, parties: Any, samples: Any, test_samples: Any, counts: np.ndarray, threshold: int | None
    ) -> ClaimTable:
        """The claims of `parties` holding `samples` / `test_samples` and `counts` [n, C] training
        samples per class: their classes are those held more than `threshold` times (None: none)."""
        order = np.argsort(np.asarray(parties, dtype=np.int64), kind="stable")
        classes = None if threshold is None else (np.asarray(counts) > threshold)[order]
        columns = (np.asarray(c, dtype=np.int64)[order] for c in (parties, samples, test_samples))
        return cls(*columns, classes)

    def _value(self, row: int, name: str) -> Any:
        if name == "classes":
            return [] if self.classes is None else np.flatnonzero(self.classes[row]).tolist()
        return int(getattr(self, name)[row])

    def __getitem__(self, party: int) -> dict[str, Any]:
        row = self._at.row(party)
        if row is None:
            raise KeyError(party)
        return {name: self._value(row, name) for name in FIELDS}

    def __contains__(self, party: object) -> bool:
        return self._at.row(party) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.parties.tolist())

    def __len__(self) -> int:
        return len(self.parties)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClaimTable):
            mine, theirs = self.state(), other.state()
            return all(_same(mine[k], theirs[k]) for k in mine)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def column(self, name: str) -> Column:
        """Field `name` of every party's claim, as the mapping party -> value."""
        if name not in FIELDS:
            raise KeyError(name)
        return Column(self, name)

    def row(self, party: object) -> int | None:
        """The row of `party` in the columns, or None."""
        return self._at.row(party)

    def state(self) -> dict[str, Any]:
        """The columns as tensors (`core.codec` writes them as safetensors)."""
        columns = {"parties": self.parties, "samples": self.samples, "test_samples": self.test_samples}
        out: dict[str, Any] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in columns.items()}
        out["classes"] = None if self.classes is None else torch.from_numpy(self.classes.copy())
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ClaimTable:
        """The table `state()` gave; ValueError when its columns do not fit together."""
        cols = {k: state.get(k) for k in ("parties", "samples", "test_samples", "classes")}
        if any(not isinstance(cols[k], torch.Tensor) for k in ("parties", "samples", "test_samples")):
            raise ValueError("a claim table needs parties, samples and test_samples tensors")
        classes = cols["classes"]
        if classes is not None and (not isinstance(classes, torch.Tensor) or classes.dim() != 2):
            raise ValueError("a claim table's classes are a bool tensor [parties, classes] or null")
        arrays = [cols[k].numpy() for k in ("parties", "samples", "test_samples")]
        return cls(*arrays, None if classes is None else classes.numpy())


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(torch.equal(a, b))


class Column(Mapping[int, Any]):
    """One field of a `ClaimTable`: party -> its samples, test samples or classes."""

    def __init__(self, table: ClaimTable, name: str) -> None:
        self.table, self.name = table, name

    def __getitem__(self, party: int) -> Any:
        row = self.table.row(party)
        if row is None:
            raise KeyError(party)
        return self.table._value(row, self.name)

    def __contains__(self, party: object) -> bool:
        return self.table.row(party) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


class Rows(Mapping[int, list[int]]):
    """party -> its row of `table` [n, C] as a list of ints (row i is party ``parties[i]``'s)."""

    def __init__(self, parties: Any, table: np.ndarray) -> None:
        self._at, self.table = Positions(parties), np.asarray(table)

    def __getitem__(self, party: int) -> list[int]:
        row = self._at.row(party)
        if row is None:
            raise KeyError(party)
        return [int(n) for n in self.table[row]]

    def __contains__(self, party: object) -> bool:
        return self._at.row(party) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self._at.parties.tolist())

    def __len__(self) -> int:
        return len(self._at.parties)
