"""The parties' own evaluation in a distributed buffered run (`validation_args.local_test`,
LG-FedAvg's personalised figures, federated evaluation): a mixin of `BufferedPhases`.

A buffer applied on an evaluation round (`validation_args.frequency_of_the_test`, and the last round)
is evaluated as a synchronous round is: the server sends EVAL with the new global model to every
silo that is here and holds a party that reports, then (federated evaluation of a personalised
algorithm) the new test; the round is recorded once the reports are in, or their silos are gone or
silent past `comm_args.round_timeout_s` (`RoundPhases`' eval and newtest phases). Meanwhile the
parties' training goes on: tasks in flight are trained, their updates arrive and are held; no update
is taken into the next buffer, and no task is sent, before the round's record is written, so the
record, and whatever the algorithm does with its test (LG-FedAvg's best warm-up model, which the
next tasks start from), comes first, as in the standalone simulation. A silo handles its messages in
order, so a party reports with the state of the last task it was sent before the EVAL: the
standalone simulation trains its parties' tasks in flight before an evaluation round's reports, and
the MPI simulation's records equal its.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
BUFFERED = "buffered"
# the phases in which updates are taken, or held: evaluation's and secure sums' (buffered_secure)
TAKING = (BUFFERED, "eval", "newtest", "keys", "share", "mask", "unmask")


class BufferedEvaluation:
    """An evaluation round of a buffered run (module docstring), on `RoundPhases`' eval phases."""

    buffer_extra: dict[str, Any]
    taking: bool = False  # take_arrived is running: a round closed within it goes on there

    def record_buffer(
        self, reports: dict | None = None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        """Record the buffer applied as round `round_idx` (`ordered`, `buffer_extra`), with the
        parties' reports on an evaluation round; a checkpoint follows if due; on to the next version."""
        self.doing = f"recording round {self.round_idx}"
        self.recorded = self.round_idx
        extra = {
            **self.buffer_extra,
            "wire_bytes_sent": self._transport.bytes_sent,
            "wire_bytes_received": self._transport.bytes_received,
        }
        self.rounds.finish_round(self.round_idx, self.ordered, reports, extra, new_reports, summed)
        self.mark_due(self.round_idx)
        self.round_idx = self.core.version

    def close_round(
        self, reports: dict | None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        """Record the evaluated round (once), then go back to the buffered phase: the updates held
        meanwhile are taken (`take_arrived`), a checkpoint taken if due."""
        if self.recorded >= self.round_idx:
            log.error("round %d was recorded already; it is not recorded again", self.round_idx)
            return
        self.record_buffer(reports, new_reports, summed)
        self.back_to_buffered()

    def back_to_buffered(self) -> None:
        """Back to the buffered phase (from an evaluation's or a secure sum's phases): the updates
        held meanwhile are taken, unless `take_arrived` is running (it goes on with them)."""
        self._phase(BUFFERED, {r for r, tasks in self.tasks.items() if tasks})
        if not self.taking:  # the phase's answers came in their own messages: take what arrived meanwhile
            self.take_held()

    def take_held(self) -> None:
        """Take the updates that arrived: a resumed run's held ones first, message by message, as
        they came before its checkpoint; then the rest."""
        core = self.core
        while core.held and self.phase == BUFFERED:
            core.arrived = {**core.held.pop(0), **core.arrived}
            self.take_arrived()
        if self.phase == BUFFERED:
            self.take_arrived()

    def on_bye(self, msg: Any) -> None:
        """A silo leaving in an evaluation round with tasks outstanding is gone (its tasks dropped at
        the next tick of the buffered phase), whether or not it still owed its report."""
        rank = msg.get_sender_id()
        if self.phase in TAKING and self.tasks.get(rank) and rank not in self.pending:
            what = f"rank {rank} said BYE with tasks outstanding in the {self.phase} phase"
            self.refusals.refused(f"rank {rank}", what, reason="a BYE", counted=False)
            self.gone.add(rank)
            return
        super().on_bye(msg)

    def _phase(self, phase: str, pending: set[int]) -> None:
        """In the buffered run's phases a silo may send a RESULT for each start version of its tasks
        outstanding, and its answer to the phase's message (transport/budget.py)."""
        super()._phase(phase, pending)
        if phase in TAKING:
            owed = {r: len(set(t.values())) for r, t in getattr(self, "tasks", {}).items()}
            for rank in pending if phase != BUFFERED else ():
                owed[rank] = owed.get(rank, 0) + 1
            self._transport.expect(owed)
