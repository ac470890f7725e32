"""What a silo publishes of itself in its own folder's `status.json` (a member of its manager), for
`fedml-moon status <output>/rank-<r>`: the round the server last gave it, its phase (waiting for the
server, training, waiting for the next round, evaluating, then finished or failed), how many rounds
it trained and its parties' training samples, the server (connected or not, when last heard), the
run's pace as the silo sees it (the mean time between two of its rounds) and an estimate of the end.
Only what the run already tells every site: nothing of another site."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml_moon.status import record as status
from fedml_moon.status.record import PUBLISH_EVERY_S

log = logging.getLogger(__name__)
PACE_ROUNDS = 10


class SiloStatus:
    """The silo's status: reads its manager's state (`silo.state`: built, welcomed, the rounds it
    trained) and liveness of the server; its own fields are what it last published."""

    def __init__(self, silo: Any) -> None:
        self.silo, self.state = silo, silo.state
        self.phase, self.round = "waiting for the server", 0
        self.train_arrivals: list[float] = []
        self.published_at = 0.0

    def publish(self, phase: str | None = None, round_idx: int | None = None) -> None:
        """Rewrite status.json now where the phase or round changed, else at most once a second."""
        now = time.monotonic()
        changed = (phase or self.phase) != self.phase or round_idx not in (None, self.round)
        if not changed and now - self.published_at < PUBLISH_EVERY_S:
            return
        self.phase = phase or self.phase
        self.round = self.round if round_idx is None else round_idx
        self.published_at = now
        try:
            status.write(self.silo.folder, self._fields())
        except (OSError, ValueError) as err:  # a status file never costs the silo its run
            log.warning("rank %d could not write its status.json: %s", self.silo.rank, err)

    def trains(self, round_idx: int) -> None:
        """A TRAIN task of `round_idx` arrived."""
        self.train_arrivals = [*self.train_arrivals, time.monotonic()][-(PACE_ROUNDS + 1) :]
        self.publish("training", round_idx)

    def _own_site(self) -> dict[str, Any]:
        """Its rank, the rounds it trained and, once built, its parties' training samples."""
        built = self.state.built
        site: dict[str, Any] = {"rank": self.silo.rank, "rounds": self.state.trained}
        if built is not None:
            site["samples"] = sum(int(c.get("samples", 0)) for c in built.claims.values())
        return site

    def _fields(self) -> dict[str, Any]:
        built = self.state.built
        train = built.run_config.train_args if built is not None else None
        gaps = [b - a for a, b in zip(self.train_arrivals, self.train_arrivals[1:], strict=False)]
        pace = sum(gaps) / len(gaps) if gaps else None
        rounds = train.comm_round if train is not None else None
        left = rounds - self.round - 1 if rounds is not None else None
        heard_at = self.silo.heard_at(0)
        return {
            "run": self.silo.folder.resolve().name,
            "algorithm": train.algorithm if train is not None else None,
            "rounds": rounds,
            "round": self.round,
            "phase": self.phase,
            "site": self._own_site(),
            "server": {
                "connected": bool(self.state.welcomed) and heard_at is not None and not self.silo.is_dead(0),
                "heard_at": heard_at,
            },
            "round_time_s": pace,
            "eta_s": left * pace if pace is not None and left is not None and left > 0 else None,
        }
