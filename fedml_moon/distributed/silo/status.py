"""What a silo publishes of itself in its own folder's `status.json` (a mixin of
`PluginClientManager`), for `fedml-moon status <output>/rank-<r>`: the round the server last gave it,
its phase (waiting for the server, training, waiting for the next round, evaluating, then finished
or failed), how many rounds it trained and its parties' training samples, the server (connected or
not, when last heard), the run's pace as the silo sees it (the mean time between two of its
rounds) and an estimate of the end. Only what the run already tells every site: nothing of another
site."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml_moon.status import record as status
from fedml_moon.status.record import PUBLISH_EVERY_S

log = logging.getLogger(__name__)
PACE_ROUNDS = 10


class SiloStatus:
    """Mixed into PluginClientManager, whose fields (rank, folder, built, welcomed) it reads."""

    def silo_status_reset(self) -> None:
        self.silo_phase, self.silo_round, self.silo_trained = "waiting for the server", 0, 0
        self.train_arrivals: list[float] = []
        self.silo_published_at = 0.0

    def silo_publish(self, phase: str | None = None, round_idx: int | None = None) -> None:
        """Rewrite status.json now where the phase or round changed, else at most once a second."""
        now = time.monotonic()
        changed = (phase or self.silo_phase) != self.silo_phase or round_idx not in (None, self.silo_round)
        if not changed and now - self.silo_published_at < PUBLISH_EVERY_S:
            return
        self.silo_phase = phase or self.silo_phase
        self.silo_round = self.silo_round if round_idx is None else round_idx
        self.silo_published_at = now
        try:
            status.write(self.folder, self._silo_fields())
        except (OSError, ValueError) as err:  # a status file never costs the silo its run
            log.warning("rank %d could not write its status.json: %s", self.rank, err)

    def silo_trains(self, round_idx: int) -> None:
        """A TRAIN task of `round_idx` arrived."""
        self.train_arrivals = [*self.train_arrivals, time.monotonic()][-(PACE_ROUNDS + 1) :]
        self.silo_publish("training", round_idx)

    def _own_site(self) -> dict[str, Any]:
        """Its rank, the rounds it trained and, once built, its parties' training samples."""
        site: dict[str, Any] = {"rank": self.rank, "rounds": self.silo_trained}
        if self.built is not None:
            site["samples"] = sum(int(c.get("samples", 0)) for c in self.built.claims.values())
        return site

    def _silo_fields(self) -> dict[str, Any]:
        train = self.built.run_config.train_args if self.built is not None else None
        gaps = [b - a for a, b in zip(self.train_arrivals, self.train_arrivals[1:], strict=False)]
        pace = sum(gaps) / len(gaps) if gaps else None
        rounds = train.comm_round if train is not None else None
        left = rounds - self.silo_round - 1 if rounds is not None else None
        heard_at = self.heard_at(0)
        return {
            "run": self.folder.resolve().name,
            "algorithm": train.algorithm if train is not None else None,
            "rounds": rounds,
            "round": self.silo_round,
            "phase": self.silo_phase,
            "site": self._own_site(),
            "server": {
                "connected": bool(self.welcomed) and heard_at is not None and not self.is_dead(0),
                "heard_at": heard_at,
            },
            "round_time_s": pace,
            "eta_s": left * pace if pace is not None and left is not None and left > 0 else None,
        }
