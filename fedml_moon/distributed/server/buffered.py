"""Buffered aggregation (FedBuff) on the distributed server: the rounds of `server_args.aggregation:
buffered` for `PluginServerManager`, in place of `RoundPhases`' train phase.

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
last buffer, updates still arriving are dropped (logged once each). Checkpoints and --resume:
`distributed.server.buffered_checkpoint`; the parties' own evaluation: `distributed.server.buffered_eval`; secure
aggregation, where a silo says HELD instead of sending a RESULT: `distributed.server.buffered_secure`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml_moon.core.validate import spec_from_shapes
from fedml_moon.distributed.managers import TRAIN
from fedml_moon.distributed.protocol import HELD, result_problem
from fedml_moon.distributed.server.buffered_checkpoint import BufferedCheckpoints
from fedml_moon.distributed.server.buffered_eval import BUFFERED, TAKING, BufferedEvaluation
from fedml_moon.distributed.server.buffered_secure import KEYS_PHASE, BufferedSecure
from fedml_moon.engine.buffer_rounds import BufferedRounds

log = logging.getLogger(__name__)


class BufferedPhases(BufferedSecure, BufferedEvaluation, BufferedCheckpoints):
    """The buffered phase (module docstring), before `RoundPhases` in a manager's bases; its
    evaluation rounds are `BufferedEvaluation`'s, its checkpoints and resume `BufferedCheckpoints`',
    its secure sums `BufferedSecure`'s."""

    core: BufferedRounds
    rounds: Any
    placement: dict[int, int]

    def set_buffering(self, core: BufferedRounds) -> None:
        self.core = core
        core.remote = bool(self.secure)  # each buffer a secure sum among its parties (buffered_secure)
        self.tasks: dict[int, dict[int, int]] = {}  # rank -> {party: start version} outstanding
        self.resent_versions: set[tuple[int, int]] = set()  # (rank, version) sent again once
        self.instant: list[int] | None = None  # on the clock: the parties of the instant being taken

    # --- work out ------------------------------------------------------------------------------------
    def next_round(self, round_idx: int) -> None:
        """The first round starts the buffered phase; after the last, FINISH as in a synchronous run."""
        if round_idx >= self.rounds.rounds:
            super().next_round(round_idx)
            return
        self._phase(BUFFERED, set())
        self.round_idx = round_idx
        self.rounds.started = time.perf_counter()
        if round_idx == 0:
            self.refill()
            return
        self.resume_buffered()  # a resumed run (buffered_checkpoint)

    def refill(self) -> None:
        """Give the free slots to parties whose silo is here (`BufferedRounds.dispatch`)."""
        away = {r for r in self.workers if r in self.gone or self.is_dead(r)}
        busy = frozenset(p for p, r in self.placement.items() if r in away)
        jobs = self.core.dispatch(busy)
        by_rank: dict[int, list[dict]] = {}
        for party, payload in jobs.items():
            by_rank.setdefault(self.placement[party], []).append({"party": party, "payload": payload})
        for rank, items in sorted(by_rank.items()):
            self.tasks.setdefault(rank, {}).update({t["party"]: self.core.version for t in items})
            self.pending.add(rank)
            self._transport.expect_more(rank)
            self.send(TRAIN, rank, round=self.core.version, tasks=items)
        self.phase_started = time.monotonic()

    def _send_work_again(self, rank: int) -> None:
        """A restarted silo lost its tasks: each start version's again, once; then the EVAL of an
        evaluation round and a checkpoint's CHECKPOINT it still owes."""
        outstanding = self.tasks.get(rank, {}) if self.phase in TAKING else {}
        for version in sorted(set(outstanding.values())):
            if (rank, version) in self.resent_versions:
                continue
            self.resent_versions.add((rank, version))
            items = [
                {"party": p, "payload": self.core.inflight[p].payload}
                for p, v in sorted(outstanding.items())
                if v == version
            ]
            self._transport.expect_more(rank)
            log.info("rank %d restarted: sent its tasks of version %d again", rank, version)
            self.send(TRAIN, rank, round=version, tasks=items)
        if self.phase != BUFFERED:
            super()._send_work_again(rank)
        self.ask_again(rank)  # a checkpoint that waits for it: asked again, after those tasks

    def register_message_receive_handlers(self) -> None:
        super().register_message_receive_handlers()
        if self.secure:
            self.register_message_receive_handler(HELD, self._guarded(self.on_held))

    # --- updates in ---------------------------------------------------------------------------------
    def on_result(self, msg: Any) -> None:
        """Take a RESULT for tasks outstanding at the sender (module docstring), or refuse it whole;
        under secure aggregation every RESULT is refused (a party's upload stays at its silo)."""
        if self.secure:
            why = "secure aggregation is on: a party's upload is never sent in the clear"
            self.refused(msg.get_sender_id(), f"refused rank {msg.get_sender_id()}'s result: {why}")
            return
        self.arrive(msg, msg.get("results"))

    def on_held(self, msg: Any) -> None:
        """Secure aggregation: the sender's parties trained their tasks of version `round` and hold
        their uploads for their buffer's secure sum (`distributed.server.buffered_secure`); taken as their
        updates' arrival, as a RESULT is, or refused whole."""
        self.arrive(msg, [{**item, "upload": {}} for item in msg.get("parties")])

    def arrive(self, msg: Any, items: list[dict]) -> None:
        """Updates (or, HELD, their notices) for tasks outstanding at the sender, or refused whole."""
        rank, version = msg.get_sender_id(), msg.get("round")
        outstanding = self.tasks.get(rank, {})
        mine = {p for p, v in outstanding.items() if v == version}
        if self.phase not in TAKING or rank in self.gone or not mine:
            self.refusals.refused(
                f"rank {rank}",
                f"dropped a RESULT from rank {rank} for version {version}: no task of that version is "
                f"outstanding at it (the server is in the {self.phase} phase at version {self.core.version})",
                reason="late or repeated result",
                level=logging.INFO if self.phase == "finish" else logging.ERROR,
                counted=self.phase != "finish",  # an update the last buffer did not need: no refusal
            )
            return
        parties = {item["party"] for item in items}
        check = (lambda party, upload: None) if self.core.remote else self._upload_problem
        problem = result_problem(items, parties, self.rounds.samples, check)
        if problem is None and not parties <= mine:
            problem = f"results are for parties {sorted(parties)[:10]}, not its tasks {sorted(mine)}"
        if problem is not None:
            self.refused(rank, f"version {self.core.version}: refused rank {rank}'s result: {problem}")
            return
        for item in items:
            del outstanding[item["party"]]
            self.core.arrived[item["party"]] = item["upload"]
        self.hold(rank, items)
        if self.phase == BUFFERED:  # an evaluation round holds the updates until its record
            if not outstanding:
                self.pending.discard(rank)
            self.phase_started = time.monotonic()
        self._advance(self.take_arrived)

    def _upload_problem(self, party: int, upload: Any) -> str | None:
        """Checked against what the party's task asked for when it was sent (`Job.spec`): an update
        that task could give but this version cannot use (LG-FedAvg's whole model from a warm-up task,
        after the warm-up) is taken, and left out by the buffer (`BufferedRounds.unusable`) as in the
        standalone simulation, not refused (its task would stay outstanding until its silo is
        given up on)."""
        job = self.core.inflight.get(party)
        if job is None:
            return super()._upload_problem(party, upload)
        self.rounds.sent = {party: job.payload}
        spec = None if job.spec is None else spec_from_shapes(job.spec)
        return self.rounds.upload_problem(party, upload, finite=False, spec=spec)

    def take_arrived(self) -> None:
        """Take what has arrived (`_take_arrived`), unless an evaluation round waits for its reports."""
        if self.phase != BUFFERED or self.taking:
            return
        self.taking = True
        try:
            self._take_arrived()
        finally:
            self.taking = False

    def _take_arrived(self) -> None:
        """All of it at real pace, then fill the freed slots; on the clock, instant by instant while
        every update of the earliest one is in, the freed slots filled after each instant (the
        standalone loop's order). A buffer applied on an evaluation round stops the taking until its
        record (`BufferedEvaluation`). After the last buffer: FINISH."""
        clock, arrived = self.core.clock, self.core.arrived
        while self.phase == BUFFERED and not self.finished():
            if clock is None:
                if not arrived:
                    break
                party = next(iter(arrived))
                self.take(party, arrived.pop(party))
                continue
            if self.instant is None:
                first = clock.peek()
                if first is None or not set(first[1]) <= set(arrived):
                    break
                self.instant = list(clock.next_instant()[1])
            while self.instant and self.phase == BUFFERED and not self.finished():
                party = self.instant.pop(0)
                self.take(party, arrived.pop(party))
            if self.phase != BUFFERED:
                return  # the rest of the instant, and its slots, once the round is recorded
            self.instant = None
            if not self.finished():
                self.refill()
        if self.phase != BUFFERED:
            return
        if self.finished():
            arrived.clear()
            self.next_round(self.rounds.rounds)
            return
        if clock is None:
            self.refill()
        self.take_cut()

    def take(self, party: int, upload: Any) -> None:
        """One update into the buffer; a full buffer is applied and recorded, on an evaluation round
        once the parties reported (`RoundPhases.after_aggregate`, then `BufferedEvaluation`)."""
        self.doing = f"taking party {party}'s update at version {self.core.version}"
        if not self.core.take(party, upload):
            return
        remote = self.core.remote  # its parties' secure sum first (buffered_secure)
        applied = self.core.releasable() if remote else self.core.apply()
        if not applied:  # dp_target_epsilon: the run ends before this buffer
            self.rounds.rounds = self.core.version
            return
        if remote:
            self.sum_buffer()
            return
        self.buffer_applied(applied)

    def buffer_applied(self, applied: tuple[int, list, dict[str, Any]]) -> None:
        """The buffer applied (`BufferedRounds.apply`: its round, parties, record fields): on an
        evaluation round its parties report first (`RoundPhases.after_aggregate`, then
        `BufferedEvaluation`); after a secure sum's phases the record brings the run back to the
        buffered phase."""
        self.round_idx, self.ordered, self.buffer_extra = applied
        self.aggregated = self.round_idx
        if self.rounds.needs_party_eval(self.round_idx):
            self.after_aggregate()  # EVAL to the silos; no task is sent before the record
            return
        if self.phase != BUFFERED:
            self.close_round(None)
            return
        self.record_buffer()
        # a new allowance of large frames: a RESULT for each TRAIN outstanding (transport/budget.py)
        self._transport.expect({r: len(set(t.values())) for r, t in self.tasks.items()})

    def finished(self) -> bool:
        return self.core.version >= self.rounds.rounds

    # --- silos that are gone -----------------------------------------------------------------------
    def on_tick(self, msg: Any) -> None:
        """A silo that is gone or dead has its tasks dropped at once, not only at the deadline."""
        if self.phase == BUFFERED:
            away = sorted(r for r in self.pending if r in self.gone or self.is_dead(r))
            if away and set(away) != self.pending:
                self.give_up_on(away, away, time.monotonic() - self.phase_started)
            if not self.core.inflight and not self.core.arrived and not self.finished():
                self._advance(self.idle)
        self.cut_overdue()
        super().on_tick(msg)

    def idle(self) -> None:
        """Nothing in flight (every silo was away when slots were to be filled): fill them now that
        silos may be back; with none back past `comm_args.round_timeout_s`, stop."""
        self.refill()
        waited = time.monotonic() - self.phase_started
        if not self.core.inflight and waited > self.deadline_s:
            self.fail(
                f"no silo is left to train at version {self.core.version} for {waited:.0f} s; "
                f"{self._resume_hint()}"
            )

    def give_up_on(self, ranks: list[int], dead: list[int], waited: float) -> None:
        """In the buffered phase: drop the tasks of the ranks given up on (their parties' updates are
        never waited for) and give their slots to others; stop only when no silo is left to train."""
        if self.phase == KEYS_PHASE:
            self.keys_given_up(ranks, self._why(ranks, dead, waited))
            return
        if self.phase != BUFFERED:
            super().give_up_on(ranks, dead, waited)
            return
        dropped = {p for r in ranks for p in self.tasks.pop(r, {})}
        for party in dropped:
            self.core.inflight.pop(party, None)
            self.core.arrived.pop(party, None)
        if self.core.clock is not None:
            self.core.clock.cancel(dropped)
        self.pending -= set(ranks)
        log.warning(
            "version %d: dropped the tasks of parties %s (%s); their slots go to others",
            self.core.version,
            sorted(dropped),
            self._why(ranks, dead, waited),
        )
        self._advance(self.take_arrived)
        if not self.core.inflight and not self.finished() and self.phase == BUFFERED:
            self.fail(
                f"no silo is left to train at version {self.core.version} (rank(s) {ranks} gone or silent "
                f"for {waited:.0f} s); {self._resume_hint()}"
            )
