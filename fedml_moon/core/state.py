"""Per-party state, keyed by the party's data-partition id (never by worker or process rank).

A party's state is a dict (MOON's model pool, SOLO's own model, ...). Stores with one interface: in
memory; on disk (one file per party) for large models or many parties, reading ahead the states of
the parties about to train (`prefetch`); and `auto` (the default), in memory until the states held
pass `AUTO_MEMORY_BYTES`, then on disk.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fedml_moon.run_folder import PARTY_FILE, replacing  # standard library only

AUTO_MEMORY_BYTES = 2 * 2**30  # `state_store: auto` moves the parties' states to disk past this
AHEAD = 2  # party states a disk store reads ahead of the one asked for

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

    def prefetch(self, parties: Iterable[int]) -> None:
        """The parties about to be asked for, in order (a disk store reads them ahead)."""


class DiskPartyStore(PartyStore):
    """On-disk store: one `party_<id>.pt` file per party under `root` (written with torch.save). After
    `prefetch(order)`, a background thread keeps the next `AHEAD` states of `order` read, so a
    party's state is ready when its training starts."""

    def __init__(self, root: str | Path) -> None:
        super().__init__()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._order: deque[int] = deque()
        self._ahead: dict[int, Future] = {}
        self._reader: ThreadPoolExecutor | None = None

    def _path(self, party_id: int) -> Path:
        return self.root / PARTY_FILE.format(int(party_id))

    def _read(self, party_id: int) -> dict[str, Any]:
        path = self._path(party_id)
        if not path.exists():
            return {}
        return torch.load(path, map_location="cpu", weights_only=True)

    def prefetch(self, parties: Iterable[int]) -> None:
        self._order = deque(int(p) for p in parties)
        self._top_up()

    def _top_up(self) -> None:
        while self._order and len(self._ahead) < AHEAD:
            party = self._order.popleft()
            if party not in self._ahead:
                if self._reader is None:
                    self._reader = ThreadPoolExecutor(1, thread_name_prefix="party-state")
                self._ahead[party] = self._reader.submit(self._read, party)

    def get(self, party_id: int) -> dict[str, Any]:
        ahead = self._ahead.pop(int(party_id), None)
        state = ahead.result() if ahead is not None else self._read(party_id)
        self._top_up()
        return state

    def put(self, party_id: int, state: dict[str, Any]) -> None:
        self._forget(party_id)
        path = self._path(party_id)
        with replacing(path, path.with_suffix(".tmp")) as tmp:  # the archive's records: party_<id>/
            torch.save(state, tmp)

    def drop(self, party_id: int) -> None:
        self._forget(party_id)
        self._path(party_id).unlink(missing_ok=True)

    def _forget(self, party_id: int) -> None:
        """A state read ahead is stale once the party's file changes: wait for the read, drop it."""
        ahead = self._ahead.pop(int(party_id), None)
        if ahead is not None:
            ahead.result()

    def __contains__(self, party_id: object) -> bool:
        return isinstance(party_id, int) and self._path(party_id).exists()

    def parties(self) -> list[int]:
        return sorted(int(p.stem.split("_", 1)[1]) for p in self.root.glob(PARTY_FILE.format("*")))


class AutoPartyStore(PartyStore):
    """`state_store: auto`: in memory while the states held total at most `limit` bytes; past it,
    every state moves to a `DiskPartyStore` under `root`, which holds them from then on."""

    def __init__(self, root: str | Path, limit: int | None = None) -> None:
        super().__init__()
        self.root, self.limit = Path(root), AUTO_MEMORY_BYTES if limit is None else limit
        self.inner: PartyStore = PartyStore()
        self._sizes: dict[int, int] = {}
        self._held = 0  # the sum of _sizes, kept as it changes

    def get(self, party_id: int) -> dict[str, Any]:
        return self.inner.get(party_id)

    def put(self, party_id: int, state: dict[str, Any]) -> None:
        self.inner.put(party_id, state)
        if isinstance(self.inner, DiskPartyStore):
            return
        size = state_bytes(state)
        self._held += size - self._sizes.get(int(party_id), 0)
        self._sizes[int(party_id)] = size
        held = self._held
        if held > self.limit:
            log.info(
                "party state: %d parties hold %.1f GB, past train_args.state_store auto's %.1f GB in memory; "
                "it moves to disk (%s)", len(self._sizes), held / 2**30, self.limit / 2**30, self.root,
            )  # fmt: skip
            disk = DiskPartyStore(self.root)
            for party in set(disk.parties()) - set(self.inner.parties()):
                disk.drop(party)  # what an earlier process left there is not this run's
            for party in self.inner.parties():
                disk.put(party, self.inner.get(party))
            self.inner, self._sizes, self._held = disk, {}, 0

    def drop(self, party_id: int) -> None:
        self._held -= self._sizes.pop(int(party_id), 0)
        self.inner.drop(party_id)

    def __contains__(self, party_id: object) -> bool:
        return party_id in self.inner

    def parties(self) -> list[int]:
        return self.inner.parties()

    def prefetch(self, parties: Iterable[int]) -> None:
        self.inner.prefetch(parties)


def state_bytes(state: Any) -> int:
    """The bytes of the tensors in a state (nested dicts and lists)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


def make_store(kind: str, root: str | Path | None = None) -> PartyStore:
    """'memory', 'disk' or 'auto' (both need `root`)."""
    if kind == "memory":
        return PartyStore()
    if kind in ("disk", "auto"):
        if root is None:
            raise ValueError(f"a {kind} store needs a folder")
        return DiskPartyStore(root) if kind == "disk" else AutoPartyStore(root)
    raise ValueError(f"unknown state store {kind!r}; choose 'memory', 'disk' or 'auto'")
