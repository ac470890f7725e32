"""What the server of a distributed run publishes of itself in `status.json`: the round in progress,
its phase and each site (its rank: connected or gone, when it was last heard, the rounds it took part
in, the messages of it that were refused, what it sent and was sent). Written as the phase changes
and at most once a second on the server's timer; `fedml-moon status` reads it
(`fedml_moon.status.record`), the status port serves it (`fedml_moon.status.http`)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from fedml_moon.status.record import PHASES, PUBLISH_EVERY_S


class StatusBoard:
    """The server's status phase: reads the server's state, writes the run's status record."""

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )
        self.published_at = 0.0

    def took_part(self, parties: list[int]) -> None:
        """A round was aggregated with `parties`' answers (their uploads, under secure aggregation their
        keys, in a buffered run the buffer's updates): it counts once for each rank that holds some."""
        placement = self.settings.placement
        for rank in {placement[p] for p in parties if p in placement}:
            self.state.sites[rank].took_part += 1

    def publish(self, force: bool = False) -> None:
        """Rewrite status.json (at most once every PUBLISH_EVERY_S unless `force`)."""
        now = time.monotonic()
        if not force and now - self.published_at < PUBLISH_EVERY_S:
            return
        self.published_at = now
        r, refusals = self.state.round, self.server.refusals
        sites = [self._site(rank) for rank in self.settings.workers]
        wire = self.server.transport.refusals
        reasons = refusals.by_reason + (wire.by_reason if wire is not refusals else Counter())
        self.rounds.recorder.publish(
            round=max(r.round_idx, r.start),
            phase=PHASES.get(r.phase, r.phase),
            sites=sites,
            refused=dict(reasons),
        )

    def _site(self, rank: int) -> dict[str, Any]:
        site, transport = self.state.sites[rank], self.server.transport
        heard_at = self.server.heard_at(rank)
        return {
            "rank": rank,
            "connected": heard_at is not None and not self.server.away(rank),
            "heard_at": heard_at,
            "rounds": site.took_part,
            "refused": site.refused,
            "messages": transport.messages_from[rank],  # its messages the transport took
            "bytes_received": transport.bytes_from[rank],
            "bytes_sent": transport.bytes_to[rank],
        }
