"""The records of a distributed buffered run, and its evaluation rounds (`validation_args.local_test`,
LG-FedAvg's personalised figures, federated evaluation): a member of `BufferedFlow`.

Each buffer applied is recorded as a round. A buffer applied on an evaluation round
(`validation_args.frequency_of_the_test`, and the last round) is evaluated as a synchronous round is:
the server sends EVAL with the new global model to every silo that is here and holds a party that
reports, then (federated evaluation of a personalised algorithm) the new test; the round is recorded
once the reports are in, or their silos are gone or silent past `comm_args.round_timeout_s`
(`RoundPhases`' eval and newtest phases). Meanwhile the parties' training goes on: tasks in flight
are trained, their updates arrive and are held; no update is taken into the next buffer, and no task
is sent, before the round's record is written, so the record, and whatever the algorithm does with
its test (LG-FedAvg's best warm-up model, which the next tasks start from), comes first, as in the
standalone simulation. A silo handles its messages in order, so a party reports with the state of
the last task it was sent before the EVAL: the standalone simulation trains its parties' tasks in
flight before an evaluation round's reports, and the MPI simulation's records equal its.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
BUFFERED = "buffered"
KEYS_PHASE = "keys"  # a buffer's secure sum waits for its parties' keys (server/buffered_secure.py)
# the phases in which updates are taken, or held: evaluation's and secure sums'
TAKING = (BUFFERED, "eval", "newtest", KEYS_PHASE, "share", "mask", "unmask")


class BufferedRecords:
    """A buffered run's records and evaluation rounds (module docstring)."""

    def __init__(self, server: Any, flow: Any, core: Any, checkpoints: Any) -> None:
        self.server, self.state, self.rounds = server, server.state, server.rounds
        self.flow, self.core, self.checkpoints = flow, core, checkpoints  # the flow, its rounds, its cuts

    def record_buffer(
        self, reports: dict | None = None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        """Record the buffer applied as round `round_idx` (`ordered`, the buffer's record fields), with
        the parties' reports on an evaluation round; a checkpoint follows if due; on to the next
        version."""
        r = self.state.round
        r.doing = f"recording round {r.round_idx}"
        r.recorded = r.round_idx
        extra = {**self.state.buffer.extra, **self.server.wire_bytes()}
        self.rounds.finish_round(r.round_idx, r.ordered, reports, extra, new_reports, summed)
        self.checkpoints.mark_due(r.round_idx)
        r.round_idx = self.core.version

    def close_round(
        self, reports: dict | None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        """Record the evaluated round (once), then go back to the buffered phase: the updates held
        meanwhile are taken (`take_arrived`), a checkpoint taken if due."""
        r = self.state.round
        if r.recorded >= r.round_idx:
            log.error("round %d was recorded already; it is not recorded again", r.round_idx)
            return
        self.record_buffer(reports, new_reports, summed)
        self.back_to_buffered()

    def back_to_buffered(self) -> None:
        """Back to the buffered phase (from an evaluation's or a secure sum's phases): the updates
        held meanwhile are taken, unless `take_arrived` is running (it goes on with them)."""
        self.server.enter(BUFFERED, {rank for rank, tasks in self.state.buffer.tasks.items() if tasks})
        if not self.state.buffer.taking:  # the phase's answers came in their own messages
            self.take_held()

    def take_held(self) -> None:
        """Take the updates that arrived: a resumed run's held ones first, message by message, as
        they came before its checkpoint; then the rest."""
        core, r = self.core, self.state.round
        while core.held and r.phase == BUFFERED:
            core.arrived = {**core.held.pop(0), **core.arrived}
            self.flow.take_arrived()
        if r.phase == BUFFERED:
            self.flow.take_arrived()

    def on_bye(self, msg: Any) -> None:
        """A silo leaving in an evaluation round with tasks outstanding is gone (its tasks dropped at
        the next tick of the buffered phase), whether or not it still owed its report."""
        rank, r = msg.get_sender_id(), self.state.round
        if r.phase in TAKING and self.state.buffer.tasks.get(rank) and rank not in r.pending:
            what = f"rank {rank} said BYE with tasks outstanding in the {r.phase} phase"
            self.server.note(rank, what, reason="a BYE", counted=False)
            self.state.sites[rank].gone = True
            return
        self.server.round_phases.on_bye(msg)

    def owed(self, phase: str, pending: set[int]) -> dict[int, int]:
        """In the buffered run's phases a silo may send a RESULT for each start version of its tasks
        outstanding, and its answer to the phase's message (transport/budget.py)."""
        if phase not in TAKING:
            return dict.fromkeys(pending, 1)
        owed = {rank: len(set(t.values())) for rank, t in self.state.buffer.tasks.items()}
        for rank in pending if phase != BUFFERED else ():
            owed[rank] = owed.get(rank, 0) + 1
        return owed
