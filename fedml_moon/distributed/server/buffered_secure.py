"""Secure aggregation in a distributed buffered run (`server_args.aggregation: buffered` with
`privacy_args.secure_aggregation`): each buffer is a secure sum among its parties over the network.
A mixin of `BufferedPhases`, on `SecureServer`'s messages.

A party's update never leaves its silo in the clear. The silo trains its task, keeps the upload and
says HELD {round: the task's start version, parties: [party, samples]}; the server takes that as the
update's arrival (`BufferedRounds.take` with `remote`: the too-stale rule, and that the task asked
for what this version sums) and keeps the party's start version and staleness discount. Once the
buffer holds K, the server opens its secure session: OPEN {round, parties: [party, start version]}
to each silo that holds some of them, then the synchronous round's messages among them
(distributed/server/secure.py: keys, roster, shares, each party's plan with its discount, masked vectors,
unmasking). The survivors' sum is the buffer's (DP's noise and accounting as in the standalone
simulation); it is applied and recorded. A party that sends no keys (its silo gone, silent, or
restarted and so without its upload) or no shares, before any party masked, is taken out of the
buffer, left out in the record, and the buffer fills again; one that leaves after it shared is not in
the sum and is named in the record's `not_summed`. A session below the crowd rules stops the run
with the reason, nothing revealed, as a synchronous round does.

Each silo checks what it is asked against its own config (`SecureWorker`): the discount
s(round - start version) of its staleness rule, `max_staleness`, a session of exactly the buffer's K
parties (under DP, noise shares sized for K).
A party masks each held upload at most once: a second session with it would let the server subtract
two sums.

While a session runs, the parties train on, as in an evaluation round: their HELD arrive and are
held; no update is taken and no task is sent before the buffer's record.
"""

from __future__ import annotations

import logging
from typing import Any

from fedml_moon.distributed.protocol import OPEN
from fedml_moon.privacy.sums import Sums

log = logging.getLogger(__name__)
KEYS_PHASE = "keys"


class BufferedSecure:
    """A buffered run's secure sums (module docstring); `SecureServer` runs the session's messages."""

    core: Any
    rounds: Any
    placement: dict[int, int]

    def sa_members(self) -> list[int]:
        """The parties of the sum: the buffer's in a buffered run."""
        return sorted(self.core.plans)

    def sa_plan_for(self, party: int) -> Any:
        """What `party` adds: its plan, with its update's staleness discount."""
        return self.rounds.privacy.plan(party, self.core.plans[party][1])

    def sum_buffer(self) -> None:
        """The full buffer's secure session: OPEN to each silo that is here and holds some of its
        parties; with none, the session goes on without them (and stops at the crowd rules)."""
        self.doing = f"opening round {self.round_idx}'s secure sum"
        self.secure_reset()
        self.sa_purpose = "buffer"
        by_rank: dict[int, list[dict]] = {}
        for party, (version, _) in sorted(self.core.plans.items()):
            by_rank.setdefault(self.placement[party], []).append({"party": party, "version": version})
        here = {r: items for r, items in by_rank.items() if r not in self.gone and not self.is_dead(r)}
        self._phase(KEYS_PHASE, set(here))
        for rank, items in sorted(here.items()):
            self.assign(rank, OPEN, round=self.round_idx, parties=items)
        if not here:
            self._guard(self.secure_after_keys)

    def secure_after_keys(self) -> None:
        """A buffer's parties that sent no keys (their silos hold their updates no more: restarted,
        or masked them already for a server that was then killed) leave the buffer; with every
        party's keys in, the session goes on."""
        missing = (
            [p for p in self.sa_members() if p not in self.sa_keys] if self.sa_purpose == "buffer" else []
        )
        if missing:
            self.leave_buffer(missing, "no keys for its secure sum")
            return
        super().secure_after_keys()

    def after_shares(self) -> None:
        """A buffer's parties whose shares did not come (their silo gone or silent) leave the buffer
        too: no party has masked its update yet, so each may take part in the next session."""
        missing = [p for p in self.sa_keys if p not in self.sa_shares] if self.sa_purpose == "buffer" else []
        if missing:
            self.leave_buffer(missing, "no shares for its secure sum")
            return
        super().after_shares()

    def leave_buffer(self, parties: list[int], why: str) -> None:
        """The session is dropped before any party masked: `parties` are taken out of the buffer
        (`BufferedRounds.unbuffer`, left out in the record), which fills again."""
        log.warning(
            "round %d: parties %s leave the buffer before its secure sum (%s); the buffer fills again",
            self.round_idx,
            parties,
            why,
        )
        self.core.unbuffer(parties, why)
        self.sa_purpose = "train"
        self.back_to_buffered()

    def buffer_summed(self, sums: Sums) -> None:
        """The buffer's secure sum is in: apply it, then its record (and evaluation)."""
        self.sa_purpose = "train"
        applied = self.core.apply(sums)
        if self.missing:
            applied[2]["not_summed"] = list(self.missing)
        self.buffer_applied(applied)

    def keys_given_up(self, ranks: list[int], why: str) -> None:
        """Ranks that owe their parties' keys and are gone or silent: the session goes on without."""
        log.warning(
            "round %d: the buffer's secure sum goes on without %s: %s",
            self.round_idx,
            self._parties_of(ranks),
            why,
        )
        self.pending.clear()
        self._guard(self.secure_after_keys)
