"""Parties' loaders made when a party is asked for, not at start-up.

A run of many parties samples a few of them a round; `PartyLoaders` is the mapping from party to
`PartyLoader` that FedML's dataset carries (`train_data_local_dict`, `test_data_local_dict`), made
from the party's index array when the party is first asked for. It holds the `keep` loaders asked
for most recently; a loader it lets go of leaves its random stream behind (only if the stream moved),
and the party's next loader continues that stream, so a party draws the batches it would have drawn
from a loader made at start-up and held all along (`tests/test_many_parties.py` compares the two).
What a run holds per party that exists is then its index arrays and, once it has trained, its
stream's state: not a loader, a generator and their tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import torch

from fedml_moon.core.parts import Positions


class PartyLoader(Protocol):
    """What the mapping makes: a loader with its own random generator (`data.loader.PartyLoader`)."""

    generator: torch.Generator


KEEP = 256  # loaders held per mapping: more than the parties of any round's chunk


class PartyLoaders(Mapping[int, PartyLoader]):
    """`{party: loader}` for the parties `ids`, each loader made by `make(position, party)` when asked
    for; the `keep` most recently asked for are held."""

    def __init__(self, ids: Sequence[int], make: Callable[[int, int], PartyLoader], keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._position = Positions(ids)  # party -> its position in `ids` (no dict of every party)
        self._make, self._keep = make, keep
        self._made: OrderedDict[int, PartyLoader] = OrderedDict()
        self._streams: dict[int, torch.Tensor] = {}  # parties let go of after their stream moved
        self._fresh: dict[int, torch.Tensor] = {}  # a made loader's first state, to tell if it moved

    def __getitem__(self, party: int) -> PartyLoader:
        party = int(party)
        if party in self._made:
            self._made.move_to_end(party)
            return self._made[party]
        position = self._position.row(party)
        if position is None:
            raise KeyError(party)
        loader = self._make(position, party)
        if party in self._streams:
            loader.generator.set_state(self._streams[party])
        self._fresh[party] = loader.generator.get_state()
        self._made[party] = loader
        while len(self._made) > self._keep:
            self._let_go(*self._made.popitem(last=False))
        return loader

    def _let_go(self, party: int, loader: PartyLoader) -> None:
        state, first = loader.generator.get_state(), self._fresh.pop(party)
        if not torch.equal(state, first):
            self._streams[party] = state

    def forget(self, party: int) -> None:
        """Back to the party's first random stream: its next loader is made as at the start."""
        party = int(party)
        self._made.pop(party, None)
        self._fresh.pop(party, None)
        self._streams.pop(party, None)

    def __iter__(self) -> Iterator[int]:
        return iter(self._position.parties.tolist())

    def __len__(self) -> int:
        return len(self._position)

    def __contains__(self, party: object) -> bool:
        try:
            return self._position.row(int(party)) is not None  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False

    def held(self) -> int:
        """How many loaders are made and held now (at most `keep`)."""
        return len(self._made)
