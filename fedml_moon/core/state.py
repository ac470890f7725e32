"""Per-party state, keyed by the party's data-partition id (never by worker or process rank).

A party's state is a dict (MOON's model pool, SOLO's own model, ...). Two stores with one interface:
in memory, or on disk (one file per party) for large models or many parties.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


class PartyStore:
    """In-memory store: party id -> state dict."""

    def __init__(self) -> None:
        self._states: dict[int, dict[str, Any]] = {}

    def get(self, party_id: int) -> dict[str, Any]:
        """The party's state; a new empty dict for a party seen for the first time."""
        return self._states.get(int(party_id), {})

    def put(self, party_id: int, state: dict[str, Any]) -> None:
        self._states[int(party_id)] = state

    def drop(self, party_id: int) -> None:
        """Forget the party's state (it starts afresh, as never trained)."""
        self._states.pop(int(party_id), None)

    def __contains__(self, party_id: object) -> bool:
        return isinstance(party_id, int) and party_id in self._states

    def parties(self) -> list[int]:
        return sorted(self._states)


class DiskPartyStore(PartyStore):
    """On-disk store: one `party_<id>.pt` file per party under `root` (written with torch.save)."""

    def __init__(self, root: str | Path) -> None:
        super().__init__()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, party_id: int) -> Path:
        return self.root / f"party_{int(party_id)}.pt"

    def get(self, party_id: int) -> dict[str, Any]:
        path = self._path(party_id)
        if not path.exists():
            return {}
        return torch.load(path, map_location="cpu", weights_only=True)

    def put(self, party_id: int, state: dict[str, Any]) -> None:
        path = self._path(party_id)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)

    def drop(self, party_id: int) -> None:
        self._path(party_id).unlink(missing_ok=True)

    def __contains__(self, party_id: object) -> bool:
        return isinstance(party_id, int) and self._path(party_id).exists()

    def parties(self) -> list[int]:
        return sorted(int(p.stem.split("_", 1)[1]) for p in self.root.glob("party_*.pt"))


def make_store(kind: str, root: str | Path | None = None) -> PartyStore:
    """'memory' or 'disk' (needs `root`)."""
    if kind == "memory":
        return PartyStore()
    if kind == "disk":
        if root is None:
            raise ValueError("a disk store needs a folder")
        return DiskPartyStore(root)
    raise ValueError(f"unknown state store {kind!r}; choose 'memory' or 'disk'")
