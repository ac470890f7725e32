"""The server (rank 0) of every distributed mode: hands each round's parties to the workers that hold
them, collects their results and reports, and records the round through ServerRounds.

The manager is the state (`state.ServerState`: a record per rank, the round's, a secure sum's, a
buffered run's) and its phases, each an object it calls: the start (`ready.ReadyPhase`: HELLO, READY,
REFUSE), the round (`rounds.RoundPhases`: train, aggregate, evaluate, record, finish), the
checkpoint (`checkpoint.CheckpointPhase`), a secure sum (`secure.SecureSum`, of a round's uploads,
the parties' test counts or a buffer's), the status (`status.StatusBoard`), the waits at each tick of
its timer (`waiting.Waiting`) and, with `server_args.aggregation: buffered`, the buffered phase
(`buffered.BufferedFlow`). The round's
progress goes through `flow`: the synchronous rounds, or the buffered phase in their place. What a
phase does to the run it does through the manager's services below (send, enter a phase, advance,
fail); what two phases share is in the state.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.distributed.managers import (
    ABORT,
    BYE,
    CHECKPOINTED,
    ERROR,
    HELLO,
    HELLO_EVERY_S,
    READY,
    REFUSE,
    REJOIN,
    REPORT,
    RESULT,
    TICK,
    _Manager,
    config_digest,
)
from fedml_moon.distributed.protocol import KEYS, MASKED, SHARES, UNMASKED
from fedml_moon.distributed.server.checkpoint import CheckpointPhase
from fedml_moon.distributed.server.ready import ReadyPhase
from fedml_moon.distributed.server.rounds import RoundPhases
from fedml_moon.distributed.server.secure import SecureSum
from fedml_moon.distributed.server.state import HeardAt, RoundState, RunSettings, ServerState, Sites
from fedml_moon.distributed.server.status import StatusBoard
from fedml_moon.distributed.server.waiting import Waiting
from fedml_moon.distributed.transport.base import QueueTransport
from fedml_moon.engine.rounds import ServerRounds

log = logging.getLogger(__name__)


class ServerManager(_Manager):
    """Rank 0: hands each round's parties to the workers that hold them, collects, records.

    A round waits for every worker it sent work to, but no longer than `comm_args.round_timeout_s`
    (default: `timeout_s`), and not for a worker whose heartbeats stopped: when the ranks still
    pending are all dead or the deadline has passed, the round goes on with the parties that
    reported if there are at least `comm_args.min_reports` of them (default `half`: half of the
    sampled parties, rounded up; `all`: every one), the others named in the log and in
    `missing_parties`; below that it waits for the deadline, then stops (the last checkpoint stays
    for --resume). A worker that comes back gets the current model with its next task; results of
    an earlier round are dropped. While it waits, it names the ranks it waits for every
    `wait_log_every_s` seconds.

    A message that is refused (it does not fit the protocol, is not the sender's to send, or is late
    or repeated) is as if it never came: it changes nothing, and the round waits for the sender's valid
    message as for a slow silo. Only a BYE, an ERROR or silence (no heartbeat) count a silo as missing.
    Repeated HELLOs are idempotent: a silo gets its work of a phase again at most once (a restarted
    silo), and a WELCOME at most once a second, whatever process it says it is.
    """

    def __init__(
        self,
        args: Any,
        transport: QueueTransport,
        rounds: ServerRounds,
        settings: RunSettings,
        core: Any = None,
    ) -> None:
        self.rounds, self.settings = rounds, settings
        self.state = ServerState(Sites.of(settings.workers), RoundState(start=settings.start))
        self.state.round.last_checkpoint = settings.resume_from
        self.session = secrets.token_hex(8)  # this server process; a restarted server has another
        self.digest = config_digest(settings.config)
        transport.expect(
            dict.fromkeys(settings.workers, 2)
        )  # each owes its HELLO and READY (transport/budget.py)
        self.ready = ReadyPhase(self)
        self.round_phases = RoundPhases(self)
        self.checkpoints = CheckpointPhase(self)
        self.secure = SecureSum(self)
        self.status_board = StatusBoard(self)
        self.waiting = Waiting(self)
        self.flow: Any = self.round_phases
        if core is not None:  # server_args.aggregation: buffered
            from fedml_moon.distributed.server.buffered import BufferedFlow

            self.flow = BufferedFlow(self, core)
        super().__init__(
            args,
            transport,
            0,
            len(settings.workers) + 1,
            settings.comm.backend,
            settings.comm.heartbeat_s,
            last_seen=HeardAt(self.state.sites),
        )
        self.status_board.publish(force=True)  # status.json from the start: the rounds planned, no site yet

    # --- who may talk to it ------------------------------------------------------------------------
    def peers(self) -> list[int]:
        return sorted(self.state.sites.seen())

    def trusted(self, sender: int) -> bool:
        """Senders whose messages reach a handler: this run's workers, and this process (its timer);
        a HELLO from another rank is answered with ABORT naming the run's ranks (`ReadyPhase`)."""
        return sender in self.state.sites or sender == self.rank

    def trusted_description(self) -> str:
        workers = self.settings.workers
        return f"its workers (ranks {workers[0]}..{workers[-1]}) and its own timer"

    def receive_message(self, msg_type: Any, msg_params: Message) -> None:
        """A HELLO from a rank of another run is answered with ABORT naming this run's ranks; a worker
        that talks to this server without having said HELLO to it (welcomed by a server process before
        this one) is asked to say HELLO now, rather than after its heartbeat timeout."""
        rank = msg_params.get_sender_id()
        if msg_type == HELLO and not self.trusted(rank):
            self.ready.on_hello(msg_params)
            return
        site = self.state.sites.get(rank)
        if msg_type not in (HELLO, TICK) and site is not None and not site.seen:
            now = time.monotonic()
            if site.rejoin_asked_at is None or now - site.rejoin_asked_at >= HELLO_EVERY_S:
                site.rejoin_asked_at = now
                self.send(REJOIN, rank)
        super().receive_message(msg_type, msg_params)

    def register_message_receive_handlers(self) -> None:
        handlers: list[tuple[str, Callable[[Message], None]]] = [
            (HELLO, self.ready.on_hello),
            (READY, self.ready.on_ready),
            (REFUSE, self.ready.on_refuse),
            (RESULT, self.flow.on_result),
            (REPORT, self.round_phases.on_report),
            (BYE, self.flow.on_bye),
            (CHECKPOINTED, self.flow.on_checkpointed),
            (ERROR, self.waiting.on_error),
            (TICK, self.waiting.on_tick),
        ]
        if self.settings.secure:  # secure aggregation's extra rounds (server/secure.py)
            handlers += [
                (KEYS, self.secure.on_keys),
                (SHARES, self.secure.on_shares),
                (MASKED, self.secure.on_masked),
                (UNMASKED, self.secure.on_unmasked),
            ]
        handlers += self.flow.handlers()
        for msg_type, handler in handlers:
            self.register_message_receive_handler(msg_type, self._guarded(handler))

    def _guarded(self, handler: Callable[[Message], None]) -> Callable[[Message], None]:
        """Nothing a worker sends stops the server: a handler that fails while checking a worker's
        message refuses that message (as if it never came). Once a message is taken, what the round
        does with it runs through `advance`, whose failures are the server's own and stop the run;
        so does a failure of the server's own timer."""

        def run(msg: Message) -> None:
            rank = msg.get_sender_id()
            try:
                handler(msg)
            except Exception as err:
                if rank == self.rank:
                    log.exception("the server failed")
                    self.fail(f"{type(err).__name__}: {err}")
                    return
                log.debug("handling rank %s's %s message failed", rank, msg.get_type(), exc_info=True)
                self.refused(
                    rank,
                    f"refused rank {rank}'s {msg.get_type()} message: handling it failed: "
                    f"{type(err).__name__}: {err}",
                )

        return run

    # --- services for the phases ----------------------------------------------------------------------
    def note(
        self, rank: int, what: str, reason: str = "", level: int = logging.WARNING, counted: bool = True
    ) -> bool:
        """Log what a rank did that the run does not take (bounded, rate-limited per rank), and count it
        in the rank's record if it is a refusal (`counted`); whether it was logged in full."""
        if counted:
            self.count_refusal(rank)
        return self.refusals.refused(f"rank {rank}", what, reason=reason, level=level, counted=counted)

    def refused(self, sender: int, problem: str) -> None:
        """A worker's message was refused: logged (bounded, rate-limited per sender); it changes nothing."""
        self.note(sender, problem, level=logging.ERROR)

    def count_refusal(self, sender: int) -> None:
        site = self.state.sites.get(sender)
        if site is not None:
            site.refused += 1

    def assign(self, rank: int, msg_type: str, **params: Any) -> None:
        """Send a rank its work of this phase, and keep it: a restarted worker gets it again."""
        self.state.sites[rank].work = (msg_type, params)
        self.send(msg_type, rank, **params)

    def grant(self, rank: int) -> None:
        """`rank` owes one more message in this phase (its work was sent again, or a task more)."""
        self.state.sites[rank].owed += 1
        self._transport.expect_more(rank)

    def declare(self, owed: dict[int, int]) -> None:
        """What each rank owes from now on (0 where absent): its large frames' allowance."""
        for rank, site in self.state.sites.items():
            site.owed = owed.get(rank, 0)
        self._transport.expect(owed)

    def enter(self, phase: str, pending: set[int]) -> None:
        """Wait for `pending`, each owing one message (the flow may say more): past what it owes (and a
        spare) a rank's large frames are refused undecoded until the next phase (transport/budget.py)."""
        self.declare(self.flow.owed(phase, pending))
        r = self.state.round
        r.phase, r.pending = phase, set(pending)
        r.phase_started = r.last_wait_log = time.monotonic()
        self.status_board.publish(force=True)

    def advance(self, step: Callable[[], None]) -> None:
        """Run a step of the round's progress; a failure in it stops the run (the server's own), with
        what it was doing and the checkpoint to go on from named (`RoundPhases.advance`)."""
        self.round_phases.advance(step)

    def wire_bytes(self) -> dict[str, int]:
        """The bytes this server sent and received so far (a round's record)."""
        return {
            "wire_bytes_sent": self._transport.bytes_sent,
            "wire_bytes_received": self._transport.bytes_received,
        }

    def away(self, rank: int) -> bool:
        """Whether `rank` is gone (BYE, ERROR, REFUSE) or silent past its heartbeats."""
        return self.state.sites[rank].gone or self.is_dead(rank)

    def expected(self, msg: Any, phase: str) -> bool:
        """Whether a worker's message belongs to the phase and round the server is in, from a rank it
        still waits for; any other (late, repeated, out of round) is dropped, as if it never came."""
        rank, round_idx, r = msg.get_sender_id(), msg.get("round"), self.state.round
        if self.state.sites[rank].gone:  # it said BYE, ERROR or REFUSE: missing until it says HELLO again
            why = f"rank {rank} said it stopped (BYE, ERROR or REFUSE); it counts again once it says HELLO"
            self.note(rank, f"dropped a {msg.get_type()} message: {why}", reason=why[7:])
            return False
        if r.phase != phase or round_idx != r.round_idx or rank not in r.pending:
            self.note(
                rank,
                f"dropped a late {msg.get_type()} message from rank {rank} for round {round_idx}: the server "
                f"is in the {r.phase} phase of round {r.round_idx}"
                + ("" if rank in r.pending else ", and waits for nothing more from it"),
                reason=f"late or repeated {msg.get_type()}",
            )
            return False
        return True

    def parties_of(self, ranks: list[int]) -> str:
        parties = sorted(p for p, r in self.settings.placement.items() if r in ranks)
        return f"parties {parties} (rank(s) {ranks})"

    def why(self, ranks: list[int], dead: list[int], waited: float) -> str:
        gone = sorted(set(ranks) & self.state.sites.gone())
        if gone and dead == ranks:
            return f"rank(s) {ranks} said BYE or ERROR ({gone})"
        if dead == ranks:
            return f"rank(s) {ranks} stopped sending heartbeats"
        return f"rank(s) {ranks} silent for {waited:.0f} s"

    def resume_hint(self) -> str:
        last = self.state.round.last_checkpoint
        if last is None:
            return "no checkpoint was written yet"
        out = self.rounds.recorder.out_dir
        return f"the checkpoint of round {last} is kept: go on with --resume {out}"

    # --- the end -------------------------------------------------------------------------------
    def fail(self, reason: str) -> None:
        log.error("stopping the run: %s", reason)
        for rank in self.settings.workers:
            try:
                self.send(ABORT, rank, reason=reason)
            except Exception as err:  # the peer may be the one that is gone
                log.info("could not tell rank %d to stop: %s", rank, err)
        self.done("failed")

    def done(self, status: str) -> None:
        self.status, self.state.round.phase = status, "done"
        self.finish()
