"""The server (rank 0) of every distributed mode: hands each round's parties to the workers that hold
them, collects their results and reports, and records the round through ServerRounds."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.config.files import DIGEST_KEYS
from fedml_moon.config.schema import CommArgs
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
    WELCOME,
    _Manager,
    config_differences,
    config_digest,
    described_differences,
)
from fedml_moon.distributed.protocol import KEYS, MASKED, SHARES, UNMASKED
from fedml_moon.distributed.refusals import RefusalLog, bounded
from fedml_moon.distributed.server.ready import ReadyPhase
from fedml_moon.distributed.server.rounds import RoundPhases
from fedml_moon.distributed.server.secure import SecureServer
from fedml_moon.distributed.server.secure_eval import SecureEvaluation
from fedml_moon.distributed.server.status import StatusBoard
from fedml_moon.distributed.transport.base import QueueTransport
from fedml_moon.engine.rounds import ServerRounds

log = logging.getLogger(__name__)
WELCOME_EVERY_S = 1.0


class PluginServerManager(ReadyPhase, RoundPhases, SecureEvaluation, SecureServer, StatusBoard, _Manager):
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
        placement: dict[int, int],
        workers: list[int],
        config: dict,
        comm: CommArgs,
        checkpoint: tuple[int, dict] = (0, {}),
        start_round: int = 0,
    ) -> None:
        self.rounds, self.placement, self.workers = rounds, placement, list(workers)
        self.evaluating: set[int] = set()  # the parties that report in this evaluated round
        self.config, self.comm_args = config, comm
        self.deadline_s = comm.round_timeout_s or comm.timeout_s
        self.checkpoint_every, self.full_config = checkpoint
        self.start = start_round
        self.resume_from = start_round - 1 if start_round > 0 else None
        self.seen: set[int] = set()
        self.round_idx, self.pending, self.phase = -1, set(), "hello"
        transport.expect(dict.fromkeys(workers, 2))  # each owes its HELLO and READY (transport/budget.py)
        self.results: dict[int, Any] = {}
        self.reports: dict[int, Any] = {}
        self.new_reports: dict[int, Any] = {}  # the new test's counts (federated, personalised)
        self.ordered: list = []
        self.missing: list[int] = []
        self.phase_started = self.last_wait_log = time.monotonic()
        self.last_checkpoint: int | None = self.resume_from
        self.welcomed_at: dict[int, float] = {}
        self.gone: set[int] = set()  # ranks that said BYE or ERROR in the middle of the run
        self.rejoin_asked: dict[int, float] = {}
        self.resent: set[tuple[int, int, str]] = set()  # (rank, round, phase) whose work went out again
        self.refusals = RefusalLog(log)
        self.process_of: dict[int, str] = {}  # rank -> the worker process that said HELLO last
        self.assigned: dict[int, tuple[str, dict]] = {}  # rank -> its work of the current phase
        self.session = secrets.token_hex(8)  # this server process; a restarted server has another
        self.digest = config_digest(config)
        self.secure = (
            rounds.secure
        )  # privacy_args.secure_aggregation (its accounting may come with the claims)
        self.secure_reset()
        self.ready_reset()
        self.status_reset()
        super().__init__(args, transport, 0, len(workers) + 1, comm.backend, comm.heartbeat_s)
        self.publish_status(force=True)  # status.json from the start: the rounds planned, no site yet

    def peers(self) -> list[int]:
        return sorted(self.seen)

    def trusted(self, sender: int) -> bool:
        """Senders whose messages reach a handler: this run's workers, and this process (its timer);
        a HELLO from another rank is answered with ABORT naming the run's ranks (on_hello)."""
        return sender in self.workers or sender == self.rank

    def trusted_description(self) -> str:
        return f"its workers (ranks {self.workers[0]}..{self.workers[-1]}) and its own timer"

    def receive_message(self, msg_type: Any, msg_params: Message) -> None:
        """A HELLO from a rank of another run is answered with ABORT naming this run's ranks; a worker
        that talks to this server without having said HELLO to it (welcomed by a server process before
        this one) is asked to say HELLO now, rather than after its heartbeat timeout."""
        rank = msg_params.get_sender_id()
        if msg_type == HELLO and not self.trusted(rank):
            self.on_hello(msg_params)
            return
        if msg_type not in (HELLO, TICK) and rank in self.workers and rank not in self.seen:
            now = time.monotonic()
            if now - self.rejoin_asked.get(rank, -1e9) >= HELLO_EVERY_S:
                self.rejoin_asked[rank] = now
                self.send(REJOIN, rank)
        super().receive_message(msg_type, msg_params)

    def register_message_receive_handlers(self) -> None:
        for msg_type, handler in (
            (HELLO, self.on_hello),
            (READY, self.on_ready),
            (REFUSE, self.on_refuse),
            (RESULT, self.on_result),
            (REPORT, self.on_report),
            (BYE, self.on_bye),
            (CHECKPOINTED, self.on_checkpointed),
            (ERROR, self.on_error),
            (TICK, self.on_tick),
        ):
            self.register_message_receive_handler(msg_type, self._guarded(handler))
        if self.secure:  # secure aggregation's extra rounds (distributed/server/secure.py)
            for msg_type, handler in (
                (KEYS, self.on_sa_keys),
                (SHARES, self.on_sa_shares),
                (MASKED, self.on_sa_masked),
                (UNMASKED, self.on_sa_unmasked),
            ):
                self.register_message_receive_handler(msg_type, self._guarded(handler))

    def _guarded(self, handler: Callable[[Message], None]) -> Callable[[Message], None]:
        """Nothing a worker sends stops the server: a handler that fails while checking a worker's
        message refuses that message (as if it never came). Once a message is taken, what the round
        does with it runs through `_advance`, whose failures are the server's own and stop the run;
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

    def refused(self, sender: int, problem: str) -> None:
        """A worker's message was refused: logged (bounded, rate-limited per sender); it changes nothing."""
        self.refusals.refused(f"rank {sender}", problem, level=logging.ERROR)

    def assign(self, rank: int, msg_type: str, **params: Any) -> None:
        """Send a rank its work of this phase, and keep it: a restarted worker gets it again."""
        self.assigned[rank] = (msg_type, params)
        self.send(msg_type, rank, **params)

    def _phase(self, phase: str, pending: set[int]) -> None:
        """Wait for `pending`, each owing one message: past it (and a spare) a rank's large frames are
        refused undecoded until the next phase (transport/budget.py)."""
        self.status_phase(phase)
        self._transport.expect(dict.fromkeys(pending, 1))
        self.phase, self.pending = phase, set(pending)
        self.phase_started = self.last_wait_log = time.monotonic()
        self.publish_status(force=True)

    # --- start ---------------------------------------------------------------------------------
    def on_hello(self, msg: Message) -> None:
        """Welcome a worker of this run with the run's config (and, before round one of a resumed
        run, the round whose checkpoint it loads); refuse one that set other values itself."""
        rank = msg.get_sender_id()
        reason = self._hello_problem(rank, msg)
        if reason is not None:  # answered while the refusal log's budget for the rank lasts
            if self.refusals.refused(f"rank {rank}", f"HELLO refused: {reason}", level=logging.ERROR):
                self.send(ABORT, rank, reason=bounded(reason, 2000))
            return
        started = self.phase != "hello"
        self.gone.discard(rank)
        if not self._welcome(rank, started):
            return  # a HELLO within a second of the last WELCOME: the silo says HELLO again if it needs to
        process, before = msg.get("process"), self.process_of.get(rank)
        self.process_of[rank] = process
        if started:  # a worker that was gone is back: its next task brings it the current model
            for party in msg.get("fresh_parties"):
                if self.placement.get(party) == rank:
                    self.rounds.aggregator.algorithm.party_reset(party)
            if before is not None and process != before:
                self._send_work_again(rank)
        if rank not in self.seen:
            self.seen.add(rank)
            log.info("rank %d is ready (%d of %d)", rank, len(self.seen), len(self.workers))
        if not started:
            self.maybe_start()

    def _hello_problem(self, rank: int, msg: Message) -> str | None:
        """Why a HELLO is refused with ABORT: another run's rank, or shared settings the silo set itself
        (`explicit`) that differ from the server's."""
        if rank not in self.workers:
            return (
                f"rank {rank} is not a worker of this run (ranks {self.workers[0]}..{self.workers[-1]}: "
                "train_args.client_num_in_total on the server)"
            )
        theirs = msg.get("config")
        differs = [
            k
            for k in config_differences(self.config, theirs)
            if k in msg.get("explicit") or (k in DIGEST_KEYS and theirs.get(k) is not None)  # its own file
        ]
        if not differs:
            return None
        return (
            f"rank {rank}'s config differs from the server's in {bounded(', '.join(differs), 400)}: "
            f"{bounded(described_differences(self.config, theirs, differs), 600)}; leave these --set out "
            "on the silo (it takes the run's config from the server) or give the server the same values"
        )

    def _welcome(self, rank: int, started: bool) -> bool:
        """WELCOME a worker, at most once a second per rank whatever process it says it is (a silo says
        HELLO every few seconds until welcomed, so a restarted one is welcomed within seconds; more
        HELLOs bring no more WELCOMEs and no more work); whether it was welcomed now."""
        now = time.monotonic()
        if now - self.welcomed_at.get(rank, -1e9) < WELCOME_EVERY_S:
            return False
        if started and now - self.welcomed_at.get(rank, -1e9) > 4 * HELLO_EVERY_S:
            log.info("rank %d is back (round %d)", rank, self.round_idx)
        self.welcomed_at[rank] = now
        self.send(
            WELCOME,
            rank,
            resume_from=None if started else self.resume_from,
            config=self.config,
            config_sha256=self.digest,
            session=self.session,
        )
        return True

    def _send_work_again(self, rank: int) -> None:
        """A restarted worker lost its work of this phase: send it again, once per rank and phase of
        a round, whatever the HELLOs say."""
        key = (rank, self.round_idx, self.phase)
        if rank not in self.pending or rank not in self.assigned or key in self.resent:
            return
        self.resent.add(key)
        self._transport.expect_more(rank)  # its answer again, and a restarted silo's HELLO and READY
        msg_type, params = self.assigned[rank]
        log.info(
            "rank %d restarted during the %s phase of round %d; sent its work again",
            rank,
            self.phase,
            self.round_idx,
        )
        self.send(msg_type, rank, **params)

    # --- waiting, and failures -----------------------------------------------------------------
    def on_error(self, msg: Message) -> None:
        """A worker that failed before the run started stops the run; in the middle of a run its
        parties count as missing (the quorum decides), as if it had died."""
        rank, reason = msg.get_sender_id(), bounded(msg.get("reason"), 2000)
        if self.phase == "hello":
            self.fail(f"rank {rank} failed: {reason}")
            return
        what = f"rank {rank} failed in the {self.phase} phase of round {self.round_idx}: {reason}"
        # bounded, as refusals are (not counted as one: an ERROR is the silo's to send)
        self.refusals.refused(f"rank {rank}", what, reason="an ERROR", level=logging.ERROR, counted=False)
        self.gone.add(rank)

    def on_tick(self, msg: Message) -> None:
        self.refusals.flush()
        if self.phase != "done":
            self.publish_status()
        now = time.monotonic()
        waited = now - self.phase_started
        if self.phase != "done" and now - self.last_wait_log >= self.wait_log_every_s:
            self.last_wait_log = now
            self._say_waiting(waited)
        if self.phase == "hello":
            if waited > self.comm_args.timeout_s:
                missing = sorted(set(self.workers) - self.seen)
                self.fail(
                    f"no answer from rank(s) {missing} for {waited:.0f} s in the hello phase "
                    f"(comm_args.timeout_s = {self.comm_args.timeout_s:g})"
                )
            return
        if self.phase == "done":
            return
        if not self.pending:
            return  # nothing to wait for: the phase's last answer moved the round on already
        dead = {r for r in self.pending if self.is_dead(r) or r in self.gone}
        if dead != self.pending and waited <= self.deadline_s:
            return
        self.give_up_on(sorted(self.pending), sorted(dead), waited)  # the deadline fires whatever is pending

    def _say_waiting(self, waited: float) -> None:
        """Name the ranks this phase still waits for, and for how long (periodically)."""
        ranks = sorted(set(self.workers) - self.seen) if self.phase == "hello" else sorted(self.pending)
        if not ranks:
            return
        where = (
            "to say hello"
            if self.phase == "hello"
            else f"in the {self.phase} phase of round {self.round_idx}"
        )
        dead = [r for r in ranks if self.is_dead(r)]
        refused = {r: why for r, why in getattr(self, "data_refused", {}).items() if r in ranks}
        log.info(
            "waiting for rank(s) %s %s: %.0f s so far (comm_args.%s = %g)%s%s",
            ranks,
            where,
            waited,
            "timeout_s" if self.phase == "hello" else "round_timeout_s",
            self.comm_args.timeout_s if self.phase == "hello" else self.deadline_s,
            f"; no heartbeat from {dead}" if dead else "",
            "".join(f"; rank {r} refused its own data: {why}" for r, why in sorted(refused.items())),
        )

    def fail(self, reason: str) -> None:
        log.error("stopping the run: %s", reason)
        for rank in self.workers:
            try:
                self.send(ABORT, rank, reason=reason)
            except Exception as err:  # the peer may be the one that is gone
                log.info("could not tell rank %d to stop: %s", rank, err)
        self.done("failed")

    def done(self, status: str) -> None:
        self.status, self.phase = status, "done"
        self.finish()
