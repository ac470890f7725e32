"""Buffered aggregation (FedBuff) on the distributed server: the flow of `server_args.aggregation:
buffered` (`ServerManager.flow`), in place of the synchronous rounds' train phase.

The run is one phase, "buffered", from the first task to the last buffer applied. `BufferedRounds`
(engine/buffer_rounds.py, the standalone loop's) draws which parties take the free slots; each gets a
TRAIN of its own start version (the workers are those of a synchronous run: they train what they are
sent and answer RESULT {round: that version}). A RESULT is taken when each of its parties has a task
of that version outstanding at the sender, with the party's sample count and an upload the server's
checks accept; anything else is refused whole, as if it never came.

- At the parties' real pace (cross-silo, MQTT + S3) each update is taken as it arrives; the slots it
  frees are filled at once.
- In the MPI simulation the simulated clock (`train_args.party_speed`) orders the updates: an update
  waits until every update of an earlier simulated instant has arrived, so the run takes them in the
  standalone loop's order and ends with its model, whatever the real order of arrival.

A silo that is gone (BYE, ERROR, REFUSE, silent past `comm_args.round_timeout_s`) has its tasks
dropped, never waited for: its parties take no work until it says HELLO again, and other parties take
their slots. A restarted silo gets its outstanding tasks again, once per start version. After the
last buffer, updates still arriving are dropped (logged once each). Its members: the records and
evaluation rounds (server/buffered_eval.py), the checkpoints and --resume
(server/buffered_checkpoint.py), the secure sums, where a silo says HELD instead of sending a RESULT
(server/buffered_secure.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml_moon.core.validate import spec_from_shapes
from fedml_moon.distributed.managers import TRAIN
from fedml_moon.distributed.protocol import HELD, result_problem
from fedml_moon.distributed.server.buffered_checkpoint import BufferedCheckpoints
from fedml_moon.distributed.server.buffered_eval import BUFFERED, KEYS_PHASE, TAKING, BufferedRecords
from fedml_moon.distributed.server.buffered_secure import BufferSum
from fedml_moon.engine.buffer_rounds import BufferedRounds

log = logging.getLogger(__name__)


class BufferedFlow:
    """The buffered phase (module docstring); the synchronous rounds' evaluation phases serve its
    evaluation rounds (`RoundPhases`), its records are `BufferedRecords`', its checkpoints
    `BufferedCheckpoints`', its secure sums `BufferSum`'s."""

    def __init__(self, server: Any, core: BufferedRounds) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )
        self.core = core
        core.remote = bool(
            self.settings.secure
        )  # each buffer a secure sum among its parties (buffered_secure)
        self.sync = server.round_phases
        self.checkpoints = BufferedCheckpoints(server, self, core)
        self.records = BufferedRecords(server, self, core, self.checkpoints)
        self.buffer_sum = BufferSum(server, self, core, self.records)

    def handlers(self) -> list:
        return [(HELD, self.on_held)] if self.settings.secure else []

    def owed(self, phase: str, pending: set[int]) -> dict[int, int]:
        return self.records.owed(phase, pending)

    def close_round(
        self, reports: dict | None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        self.records.close_round(reports, new_reports, summed)

    def on_bye(self, msg: Any) -> None:
        self.records.on_bye(msg)

    def on_checkpointed(self, msg: Any) -> None:
        self.checkpoints.on_checkpointed(msg)

    # --- work out ------------------------------------------------------------------------------------
    def next_round(self, round_idx: int) -> None:
        """The first round starts the buffered phase; after the last, FINISH as in a synchronous run."""
        if round_idx >= self.rounds.rounds:
            self.sync.next_round(round_idx)
            return
        self.server.enter(BUFFERED, set())
        self.state.round.round_idx = round_idx
        self.rounds.started = time.perf_counter()
        if round_idx == 0:
            self.refill()
            if self.core.clock is not None:  # the clock's own events (arrivals, wakes) wait for no one
                self.server.advance(self.take_arrived)
            return
        self.checkpoints.resume()  # a resumed run

    def refill(self) -> None:
        """Give the free slots to parties whose silo is here (`BufferedRounds.dispatch`)."""
        tasks, r = self.state.buffer.tasks, self.state.round
        away = {rank for rank in self.settings.workers if self.server.away(rank)}
        busy = frozenset(p for p, rank in self.settings.placement.items() if rank in away)
        jobs = self.core.dispatch(busy)
        by_rank: dict[int, list[dict]] = {}
        for party, payload in jobs.items():
            by_rank.setdefault(self.settings.placement[party], []).append(
                {"party": party, "payload": payload}
            )
        for rank, items in sorted(by_rank.items()):
            tasks.setdefault(rank, {}).update({t["party"]: self.core.version for t in items})
            r.pending.add(rank)
            self.server.grant(rank)
            self.server.send(TRAIN, rank, round=self.core.version, tasks=items)
        r.phase_started = time.monotonic()

    def send_tasks(self, rank: int, version: int, parties: list[int]) -> None:
        """Send `rank` its tasks of `version` (again): one TRAIN, and the RESULT it owes for it."""
        items = [{"party": p, "payload": self.core.inflight[p].payload} for p in sorted(parties)]
        self.server.grant(rank)
        self.server.send(TRAIN, rank, round=version, tasks=items)

    def send_work_again(self, rank: int) -> None:
        """A restarted silo lost its tasks: each start version's again, once; then the EVAL of an
        evaluation round and a checkpoint's CHECKPOINT it still owes."""
        b, phase = self.state.buffer, self.state.round.phase
        outstanding = b.tasks.get(rank, {}) if phase in TAKING else {}
        for version in sorted(set(outstanding.values())):
            if (rank, version) in b.resent_versions:
                continue
            b.resent_versions.add((rank, version))
            log.info("rank %d restarted: sent its tasks of version %d again", rank, version)
            self.send_tasks(rank, version, [p for p, v in outstanding.items() if v == version])
        if phase != BUFFERED:
            self.sync.send_work_again(rank)
        self.checkpoints.ask_again(rank)  # a checkpoint that waits for it: asked again, after those tasks

    # --- updates in ---------------------------------------------------------------------------------
    def on_result(self, msg: Any) -> None:
        """Take a RESULT for tasks outstanding at the sender (module docstring), or refuse it whole;
        under secure aggregation every RESULT is refused (a party's upload stays at its silo)."""
        if self.settings.secure:
            why = "secure aggregation is on: a party's upload is never sent in the clear"
            self.server.refused(msg.get_sender_id(), f"refused rank {msg.get_sender_id()}'s result: {why}")
            return
        self.arrive(msg, msg.get("results"))

    def on_held(self, msg: Any) -> None:
        """Secure aggregation: the sender's parties trained their tasks of version `round` and hold
        their uploads for their buffer's secure sum (server/buffered_secure.py); taken as their
        updates' arrival, as a RESULT is, or refused whole."""
        self.arrive(msg, [{**item, "upload": {}} for item in msg.get("parties")])

    def arrive(self, msg: Any, items: list[dict]) -> None:
        """Updates (or, HELD, their notices) for tasks outstanding at the sender, or refused whole."""
        rank, version, phase = msg.get_sender_id(), msg.get("round"), self.state.round.phase
        outstanding = self.state.buffer.tasks.get(rank, {})
        mine = {p for p, v in outstanding.items() if v == version}
        if phase not in TAKING or self.state.sites[rank].gone or not mine:
            self.server.note(
                rank,
                f"dropped a RESULT from rank {rank} for version {version}: no task of that version is "
                f"outstanding at it (the server is in the {phase} phase at version {self.core.version})",
                reason="late or repeated result",
                level=logging.INFO if phase == "finish" else logging.ERROR,
                counted=phase != "finish",  # an update the last buffer did not need: no refusal
            )
            return
        parties = {item["party"] for item in items}
        check = (lambda party, upload: None) if self.core.remote else self.upload_problem
        problem = result_problem(items, parties, self.rounds.samples, check)
        if problem is None and not parties <= mine:
            problem = f"results are for parties {sorted(parties)[:10]}, not its tasks {sorted(mine)}"
        if problem is not None:
            self.server.refused(rank, f"version {self.core.version}: refused rank {rank}'s result: {problem}")
            return
        for item in items:
            del outstanding[item["party"]]
            self.core.arrived[item["party"]] = item["upload"]
        self.checkpoints.hold(rank, items)
        if phase == BUFFERED:  # an evaluation round holds the updates until its record
            if not outstanding:
                self.state.round.pending.discard(rank)
            self.state.round.phase_started = time.monotonic()
        self.server.advance(self.take_arrived)

    def upload_problem(self, party: int, upload: Any) -> str | None:
        """Checked against what the party's task asked for when it was sent (`Job.spec`): an update
        that task could give but this version cannot use (LG-FedAvg's whole model from a warm-up task,
        after the warm-up) is taken, and left out by the buffer (`BufferedRounds.unusable`) as in the
        standalone simulation, not refused (its task would stay outstanding until its silo is
        given up on)."""
        job = self.core.inflight.get(party)
        if job is None:
            return self.sync.upload_problem(party, upload)
        self.rounds.sent = {party: job.payload}
        spec = None if job.spec is None else spec_from_shapes(job.spec)
        return self.rounds.uploads.upload_problem(party, upload, finite=False, spec=spec)

    def take_arrived(self) -> None:
        """Take what has arrived (`_take_arrived`), unless an evaluation round waits for its reports."""
        b = self.state.buffer
        if self.state.round.phase != BUFFERED or b.taking:
            return
        b.taking = True
        try:
            self._take_arrived()
        finally:
            b.taking = False

    def _take_arrived(self) -> None:
        """All of it at real pace, then fill the freed slots; on the clock, instant by instant while
        every update of the earliest one is in, the freed slots filled after each instant (the
        standalone loop's order). A buffer applied on an evaluation round stops the taking until its
        record (`BufferedRecords`). After the last buffer: FINISH."""
        clock, arrived, r, b = self.core.clock, self.core.arrived, self.state.round, self.state.buffer
        while r.phase == BUFFERED and not self.finished():
            if clock is None:
                if not arrived:
                    break
                party = next(iter(arrived))
                self.take(party, arrived.pop(party))
                continue
            if b.instant is None:
                first = clock.peek()  # its ids < 0 are the clock's own (arrival, wake): none to wait for
                if first is None or not {p for p in first[1] if p >= 0} <= set(arrived):
                    break
                b.instant = [p for p in clock.next_instant()[1] if p >= 0]
            while b.instant and r.phase == BUFFERED and not self.finished():
                party = b.instant.pop(0)
                self.take(party, arrived.pop(party))
            if r.phase != BUFFERED:
                return  # the rest of the instant, and its slots, once the round is recorded
            b.instant = None
            if not self.finished():
                self.refill()
        if r.phase != BUFFERED:
            return
        if self.finished():
            arrived.clear()
            self.next_round(self.rounds.rounds)
            return
        if clock is None:
            self.refill()
        self.checkpoints.take_cut()

    def take(self, party: int, upload: Any) -> None:
        """One update into the buffer; a full buffer is applied and recorded, on an evaluation round
        once the parties reported (`RoundPhases.after_aggregate`, then `BufferedRecords`)."""
        self.state.round.doing = f"taking party {party}'s update at version {self.core.version}"
        if not self.core.take(party, upload):
            return
        remote = self.core.remote  # its parties' secure sum first (buffered_secure)
        applied = self.core.releasable() if remote else self.core.apply()
        if not applied:  # dp_target_epsilon: the run ends before this buffer
            self.rounds.rounds = self.core.version
            return
        if remote:
            self.buffer_sum.open()
            return
        self.buffer_applied(applied)

    def buffer_applied(self, applied: tuple[int, list, dict[str, Any]]) -> None:
        """The buffer applied (`BufferedRounds.apply`: its round, parties, record fields): on an
        evaluation round its parties report first (`RoundPhases.after_aggregate`, then
        `BufferedRecords`); after a secure sum's phases the record brings the run back to the
        buffered phase."""
        r = self.state.round
        r.round_idx, r.ordered, self.state.buffer.extra = applied
        r.aggregated = r.round_idx
        self.server.status_board.took_part([party for party, _ in applied[2].get("updates", [])])
        if self.rounds.evaluation.needs_party_eval(r.round_idx):
            self.sync.after_aggregate()  # EVAL to the silos; no task is sent before the record
            return
        if r.phase != BUFFERED:
            self.close_round(None)
            return
        self.records.record_buffer()
        # a new allowance of large frames: a RESULT for each TRAIN outstanding (transport/budget.py)
        self.server.declare({rank: len(set(t.values())) for rank, t in self.state.buffer.tasks.items()})

    def finished(self) -> bool:
        return self.core.version >= self.rounds.rounds

    # --- silos that are gone -----------------------------------------------------------------------
    def tick(self) -> None:
        """A silo that is gone or dead has its tasks dropped at once, not only at the deadline."""
        r = self.state.round
        if r.phase == BUFFERED:
            away = sorted(rank for rank in r.pending if self.server.away(rank))
            if away and set(away) != r.pending:
                self.give_up_on(away, away, time.monotonic() - r.phase_started)
            if not self.core.inflight and not self.core.arrived and not self.finished():
                clocked = self.core.clock is not None and bool(self.core.clock.events)
                self.server.advance(self.take_arrived if clocked else self.idle)
        self.checkpoints.overdue()

    def idle(self) -> None:
        """Nothing in flight (every silo was away when slots were to be filled): fill them now that
        silos may be back; with none back past `comm_args.round_timeout_s`, stop."""
        self.refill()
        waited = time.monotonic() - self.state.round.phase_started
        if not self.core.inflight and waited > self.settings.deadline_s:
            self.server.fail(
                f"no silo is left to train at version {self.core.version} for {waited:.0f} s; "
                f"{self.server.resume_hint()}"
            )

    def give_up_on(self, ranks: list[int], dead: list[int], waited: float) -> None:
        """In the buffered phase: drop the tasks of the ranks given up on (their parties' updates are
        never waited for) and give their slots to others; stop only when no silo is left to train."""
        r = self.state.round
        if r.phase == KEYS_PHASE:
            self.buffer_sum.keys_given_up(ranks, self.server.why(ranks, dead, waited))
            return
        if r.phase != BUFFERED:
            self.sync.give_up_on(ranks, dead, waited)
            return
        dropped = {p for rank in ranks for p in self.state.buffer.tasks.pop(rank, {})}
        for party in dropped:
            self.core.inflight.pop(party, None)
            self.core.arrived.pop(party, None)
        if self.core.clock is not None:
            self.core.clock.cancel(dropped)
        r.pending -= set(ranks)
        log.warning(
            "version %d: dropped the tasks of parties %s (%s); their slots go to others",
            self.core.version,
            sorted(dropped),
            self.server.why(ranks, dead, waited),
        )
        self.server.advance(self.take_arrived)
        if not self.core.inflight and not self.finished() and r.phase == BUFFERED:
            self.server.fail(
                f"no silo is left to train at version {self.core.version} (rank(s) {ranks} gone or silent "
                f"for {waited:.0f} s); {self.server.resume_hint()}"
            )
