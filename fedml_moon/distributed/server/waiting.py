"""What the server does while it waits: at each tick of its timer, it names the ranks the phase waits
for (every `wait_log_every_s` seconds), and ends a wait whose ranks are all gone or silent, or that
passed its deadline (`comm_args.timeout_s` before the run, `comm_args.round_timeout_s` in it),
through the flow's `give_up_on`; an ERROR from a worker stops the run before it started, and makes
the rank gone in it."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.status.refusals import bounded

log = logging.getLogger(__name__)


class Waiting:
    """The server's TICK and ERROR handlers (module docstring)."""

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings = server, server.state, server.settings

    def on_error(self, msg: Message) -> None:
        """A worker that failed before the run started stops the run; in the middle of a run its
        parties count as missing (the quorum decides), as if it had died."""
        rank, reason, r = msg.get_sender_id(), bounded(msg.get("reason"), 2000), self.state.round
        if r.phase == "hello":
            self.server.fail(f"rank {rank} failed: {reason}")
            return
        what = f"rank {rank} failed in the {r.phase} phase of round {r.round_idx}: {reason}"
        # bounded, as refusals are (not counted as one: an ERROR is the silo's to send)
        self.server.note(rank, what, reason="an ERROR", level=logging.ERROR, counted=False)
        self.state.sites[rank].gone = True

    def on_tick(self, msg: Message) -> None:
        """The flow's own tick first (a buffered run drops the tasks of silos gone), then the wait's."""
        self.server.flow.tick()
        self.server.refusals.flush()
        r = self.state.round
        if r.phase != "done":
            self.server.status_board.publish()
        now = time.monotonic()
        waited = now - r.phase_started
        if r.phase != "done" and now - r.last_wait_log >= self.server.wait_log_every_s:
            r.last_wait_log = now
            self._say_waiting(waited)
        if r.phase == "hello":
            if waited > self.settings.comm.timeout_s:
                missing = sorted(set(self.settings.workers) - self.state.sites.seen())
                self.server.fail(
                    f"no answer from rank(s) {missing} for {waited:.0f} s in the hello phase "
                    f"(comm_args.timeout_s = {self.settings.comm.timeout_s:g})"
                )
            return
        if r.phase == "done" or not r.pending:
            return  # nothing to wait for: the phase's last answer moved the round on already
        dead = {rank for rank in r.pending if self.server.away(rank)}
        if dead != r.pending and waited <= self.settings.deadline_s:
            return
        # the deadline fires whatever is pending
        self.server.flow.give_up_on(sorted(r.pending), sorted(dead), waited)

    def _say_waiting(self, waited: float) -> None:
        """Name the ranks this phase still waits for, and for how long (periodically)."""
        r, sites = self.state.round, self.state.sites
        hello = r.phase == "hello"
        ranks = sorted(set(self.settings.workers) - sites.seen()) if hello else sorted(r.pending)
        if not ranks:
            return
        where = "to say hello" if hello else f"in the {r.phase} phase of round {r.round_idx}"
        dead = [rank for rank in ranks if self.server.is_dead(rank)]
        refused = {rank: sites[rank].data_refused for rank in ranks if sites[rank].data_refused is not None}
        log.info(
            "waiting for rank(s) %s %s: %.0f s so far (comm_args.%s = %g)%s%s",
            ranks,
            where,
            waited,
            "timeout_s" if hello else "round_timeout_s",
            self.settings.comm.timeout_s if hello else self.settings.deadline_s,
            f"; no heartbeat from {dead}" if dead else "",
            "".join(f"; rank {rank} refused its own data: {why}" for rank, why in sorted(refused.items())),
        )
