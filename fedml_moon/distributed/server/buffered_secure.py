"""Secure aggregation in a distributed buffered run (`server_args.aggregation: buffered` with
`privacy_args.secure_aggregation`): each buffer is a secure sum among its parties over the network,
a job of `server/secure.py`'s `SecureSum`.

A party's update never leaves its silo in the clear. The silo trains its task, keeps the upload and
says HELD {round: the task's start version, parties: [party, samples]}; the server takes that as the
update's arrival (`BufferedRounds.take` with `remote`: the too-stale rule, and that the task asked
for what this version sums) and keeps the party's start version and staleness discount. Once the
buffer holds K, the server opens its secure session: OPEN {round, parties: [party, start version]}
to each silo that holds some of them, then the synchronous round's messages among them (keys,
roster, shares, each party's plan with its discount, masked vectors, unmasking). The survivors' sum
is the buffer's (DP's noise and accounting as in the standalone simulation); it is applied and
recorded. A party that sends no keys (its silo gone, silent, or restarted and so without its
upload) or no shares, before any party masked, is taken out of the buffer, left out in the record,
and the buffer fills again; one that leaves after it shared is not in the sum and is named in the
record's `not_summed`. A session below the crowd rules stops the run with the reason, nothing
revealed, as a synchronous round does.

Each silo checks what it is asked against its own config (distributed/silo/secure.py): the discount
s(round - start version) of its staleness rule, `max_staleness`, a session of exactly the buffer's K
parties (under DP, noise shares sized for K). A party masks each held upload at most once: a second
session with it would let the server subtract two sums.

While a session runs, the parties train on, as in an evaluation round: their HELD arrive and are
held; no update is taken and no task is sent before the buffer's record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedml_moon.distributed.protocol import OPEN
from fedml_moon.distributed.server.buffered_eval import KEYS_PHASE
from fedml_moon.distributed.server.secure_round import TrainSum
from fedml_moon.privacy.sums import Sums

log = logging.getLogger(__name__)


class BufferSum(TrainSum):
    """A full buffer's secure sum (module docstring): its parties' updates, each with its discount."""

    keys_phase = KEYS_PHASE

    def __init__(self, server: Any, flow: Any, core: Any, records: Any) -> None:
        super().__init__(server)
        self.settings, self.flow, self.core, self.records = server.settings, flow, core, records

    def members(self) -> list[int]:
        """The parties of the sum: the buffer's."""
        return sorted(self.core.plans)

    def plan_for(self, party: int) -> Any:
        """What `party` adds: its plan, with its update's staleness discount."""
        return self.rounds.privacy.plan(party, self.core.plans[party][1])

    def holds(self, rank: int) -> set[int]:
        """The buffer's parties `rank` holds."""
        return {p for p in self.members() if self.settings.placement[p] == rank}

    def keys_taken(self, party: int) -> None:
        """A buffer's keys count for nothing more."""

    def keys_in(self) -> Callable[[], None]:
        return self.server.secure.after_keys

    def open(self) -> None:
        """The full buffer's secure session: OPEN to each silo that is here and holds some of its
        parties; with none, the session goes on without them (and stops at the crowd rules)."""
        r = self.state.round
        r.doing = f"opening round {r.round_idx}'s secure sum"
        self.server.secure.begin(self)
        by_rank: dict[int, list[dict]] = {}
        for party, (version, _) in sorted(self.core.plans.items()):
            by_rank.setdefault(self.settings.placement[party], []).append(
                {"party": party, "version": version}
            )
        here = {rank: items for rank, items in by_rank.items() if not self.server.away(rank)}
        self.server.enter(KEYS_PHASE, set(here))
        for rank, items in sorted(here.items()):
            self.server.assign(rank, OPEN, round=r.round_idx, parties=items)
        if not here:
            self.server.secure.guard(self.server.secure.after_keys)

    def ready_for_roster(self) -> bool:
        """A buffer's parties that sent no keys (their silos hold their updates no more: restarted,
        or masked them already for a server that was then killed) leave the buffer; with every
        party's keys in, the session goes on."""
        keys = self.state.secure.keys
        missing = [p for p in self.members() if p not in keys]
        if missing:
            self.leave_buffer(missing, "no keys for its secure sum")
            return False
        return True

    def ready_for_mask(self) -> bool:
        """A buffer's parties whose shares did not come (their silo gone or silent) leave the buffer
        too: no party has masked its update yet, so each may take part in the next session."""
        s = self.state.secure
        missing = [p for p in s.keys if p not in s.shares]
        if missing:
            self.leave_buffer(missing, "no shares for its secure sum")
            return False
        return True

    def leave_buffer(self, parties: list[int], why: str) -> None:
        """The session is dropped before any party masked: `parties` are taken out of the buffer
        (`BufferedRounds.unbuffer`, left out in the record), which fills again."""
        log.warning(
            "round %d: parties %s leave the buffer before its secure sum (%s); the buffer fills again",
            self.state.round.round_idx,
            parties,
            why,
        )
        self.core.unbuffer(parties, why)
        self.server.secure.end()
        self.records.back_to_buffered()

    def summed(self, total: Any, survivors: list[int]) -> None:
        """The buffer's secure sum is in: apply it, then its record (and evaluation)."""
        sums: Sums = self.server.secure.sums(total, survivors)
        self.server.secure.end()
        applied = self.core.apply(sums, survivors)
        if self.state.round.missing:
            applied[2]["not_summed"] = list(self.state.round.missing)
        self.flow.buffer_applied(applied)

    def keys_given_up(self, ranks: list[int], why: str) -> None:
        """Ranks that owe their parties' keys and are gone or silent: the session goes on without."""
        log.warning(
            "round %d: the buffer's secure sum goes on without %s: %s",
            self.state.round.round_idx,
            self.server.parties_of(ranks),
            why,
        )
        self.state.round.pending.clear()
        self.server.secure.guard(self.server.secure.after_keys)
