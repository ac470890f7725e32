"""What the server of a distributed run publishes of itself in `status.json` (a mixin of
`PluginServerManager`): the round in progress, its phase and each site (its rank: connected or gone,
when it was last heard, the rounds it took part in, the messages of it that were refused). Written
as the phase changes and at most once a second on the server's timer; `fedml-moon status` reads it
(`fedml_moon.status.record`)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from fedml_moon.status.record import PHASES, PUBLISH_EVERY_S


class StatusBoard:
    """Mixed into PluginServerManager, whose fields (workers, placement, phase, results, round_idx,
    gone, refusals, rounds.recorder) it reads."""

    def status_reset(self) -> None:
        self.took_part: Counter = Counter()  # rank -> rounds whose train phase it answered
        self.published_at = 0.0

    def status_phase(self, phase: str) -> None:
        """Called as the server enters `phase`, before its fields change: a train phase left counts
        a round for each rank whose parties' answers it took (their uploads, or under secure
        aggregation their keys)."""
        if self.phase == "train" and phase != "train":
            for rank in {self.placement[p] for p in self.results if p in self.placement}:
                self.took_part[rank] += 1

    def publish_status(self, force: bool = False) -> None:
        """Rewrite status.json (at most once every PUBLISH_EVERY_S unless `force`)."""
        now = time.monotonic()
        if not force and now - self.published_at < PUBLISH_EVERY_S:
            return
        self.published_at = now
        sites = [self._site(rank) for rank in self.workers]
        round_idx = max(self.round_idx, self.start)
        wire = self._transport.refusals
        reasons = self.refusals.by_reason + (wire.by_reason if wire is not self.refusals else Counter())
        self.rounds.recorder.publish(
            round=round_idx, phase=PHASES.get(self.phase, self.phase), sites=sites, refused=dict(reasons)
        )

    def _site(self, rank: int) -> dict[str, Any]:
        heard_at = self.heard_at(rank)
        return {
            "rank": rank,
            "connected": heard_at is not None and rank not in self.gone and not self.is_dead(rank),
            "heard_at": heard_at,
            "rounds": self.took_part[rank],
            "refused": self.refusals.by_source[f"rank {rank}"],
            "messages": self._transport.messages_from[rank],  # its messages the transport took
            "bytes_received": self._transport.bytes_from[rank],
            "bytes_sent": self._transport.bytes_to[rank],
        }
