"""The server (rank 0) of every distributed mode: hands each round's parties to the workers that hold
them, collects their results and reports, and records the round through ServerRounds."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.config_schema import CommArgs
from fedml_moon.core.validate import BadUpload
from fedml_moon.distributed.managers import (
    ABORT,
    BYE,
    CHECKPOINT,
    CHECKPOINTED,
    ERROR,
    EVAL,
    FINISH,
    HELLO,
    HELLO_EVERY_S,
    REJOIN,
    REPORT,
    RESULT,
    TICK,
    TRAIN,
    WELCOME,
    _Manager,
    config_differences,
    config_digest,
    described_differences,
    quorum,
)
from fedml_moon.distributed.protocol import KEYS, MASKED, SHARES, UNMASKED, reports_problem, result_problem
from fedml_moon.distributed.secure import SecureServer
from fedml_moon.distributed.transport.base import QueueTransport
from fedml_moon.engine.resume import Holding, due, save
from fedml_moon.engine.rounds import ServerRounds

log = logging.getLogger(__name__)


class PluginServerManager(SecureServer, _Manager):
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
        self.config, self.comm_args = config, comm
        self.deadline_s = comm.round_timeout_s or comm.timeout_s
        self.checkpoint_every, self.full_config = checkpoint
        self.start = start_round
        self.resume_from = start_round - 1 if start_round > 0 else None
        self.seen: set[int] = set()
        self.round_idx, self.pending, self.phase = -1, set(), "hello"
        self.results: dict[int, Any] = {}
        self.reports: dict[int, Any] = {}
        self.ordered: list = []
        self.missing: list[int] = []
        self.phase_started = self.last_wait_log = time.monotonic()
        self.last_checkpoint: int | None = self.resume_from
        self.welcomed_at: dict[int, float] = {}
        self.gone: set[int] = set()  # ranks that said BYE or ERROR in the middle of the run
        self.out: set[int] = set()  # ranks whose message of this phase was refused
        self.rejoin_asked: dict[int, float] = {}
        self.process_of: dict[int, str] = {}  # rank -> the worker process that said HELLO last
        self.assigned: dict[int, tuple[str, dict]] = {}  # rank -> its work of the current phase
        self.session = secrets.token_hex(8)  # this server process; a restarted server has another
        self.digest = config_digest(config)
        privacy = rounds.privacy
        self.secure = privacy is not None and privacy.options.secure_aggregation
        self.secure_reset()
        super().__init__(args, transport, 0, len(workers) + 1, comm.backend, comm.heartbeat_s)

    def peers(self) -> list[int]:
        return sorted(self.seen)

    def receive_message(self, msg_type: Any, msg_params: Message) -> None:
        """A worker that talks to this server without having said HELLO to it (it was welcomed by a
        server process before this one) is asked to say HELLO now, rather than after its heartbeat
        timeout."""
        rank = msg_params.get_sender_id()
        if msg_type not in (HELLO, TICK) and rank in self.workers and rank not in self.seen:
            now = time.monotonic()
            if now - self.rejoin_asked.get(rank, -1e9) >= HELLO_EVERY_S:
                self.rejoin_asked[rank] = now
                self.send(REJOIN, rank)
        super().receive_message(msg_type, msg_params)

    def register_message_receive_handlers(self) -> None:
        for msg_type, handler in (
            (HELLO, self.on_hello),
            (RESULT, self.on_result),
            (REPORT, self.on_report),
            (BYE, self.on_bye),
            (CHECKPOINTED, self.on_checkpointed),
            (ERROR, self.on_error),
            (TICK, self.on_tick),
        ):
            self.register_message_receive_handler(msg_type, self._guarded(handler))
        if self.secure:  # secure aggregation's extra rounds (distributed/secure.py)
            for msg_type, handler in (
                (KEYS, self.on_sa_keys),
                (SHARES, self.on_sa_shares),
                (MASKED, self.on_sa_masked),
                (UNMASKED, self.on_sa_unmasked),
            ):
                self.register_message_receive_handler(msg_type, self._guarded(handler))

    def _guarded(self, handler: Callable[[Message], None]) -> Callable[[Message], None]:
        """Nothing a worker sends stops the server: a handler that fails on a worker's message refuses
        that message (the worker counts as missing in this phase). The run stops, with its reason,
        only on the server's own failures (its timer's handler) and on `on_bad_upload: stop`."""

        def run(msg: Message) -> None:
            rank = msg.get_sender_id()
            try:
                handler(msg)
            except BadUpload as err:
                self.fail(str(err))
            except Exception as err:
                if rank == self.rank:
                    log.exception("the server failed")
                    self.fail(f"{type(err).__name__}: {err}")
                    return
                log.exception("refused rank %s's %s message: handling it failed", rank, msg.get_type())
                self.refused(rank, f"{type(err).__name__}: {err}")

        return run

    def refused(self, sender: int, problem: str) -> None:
        """A worker's message was refused: in a phase that waits for it, it counts as missing."""
        if sender in self.workers and self.phase not in ("hello", "done"):
            self.out.add(sender)

    def assign(self, rank: int, msg_type: str, **params: Any) -> None:
        """Send a rank its work of this phase, and keep it: a restarted worker gets it again."""
        self.assigned[rank] = (msg_type, params)
        self.send(msg_type, rank, **params)

    def _phase(self, phase: str, pending: set[int]) -> None:
        self.phase, self.pending, self.out = phase, set(pending), set()
        self.phase_started = self.last_wait_log = time.monotonic()

    # --- start ---------------------------------------------------------------------------------
    def on_hello(self, msg: Message) -> None:
        """Welcome a worker of this run with the run's config (and, before round one of a resumed
        run, the round whose checkpoint it loads); refuse one that set other values itself."""
        rank = msg.get_sender_id()
        if rank not in self.workers:
            reason = (
                f"rank {rank} is not a worker of this run (ranks {self.workers[0]}..{self.workers[-1]}: "
                "train_args.client_num_in_total on the server)"
            )
            log.warning("HELLO refused: %s", reason)
            self.send(ABORT, rank, reason=reason)
            return
        theirs = msg.get("config") if isinstance(msg.get("config"), dict) else {}
        explicit = [k for k in msg.get("explicit") or [] if isinstance(k, str)]
        differs = [k for k in config_differences(self.config, theirs) if k in explicit]
        if differs:
            reason = (
                f"rank {rank}'s config differs from the server's in {', '.join(differs)}: "
                f"{described_differences(self.config, theirs, differs)}; leave these --set out on the "
                "silo (it takes the run's config from the server) or give the server the same values"
            )
            log.error("%s; it is refused", reason)
            self.send(ABORT, rank, reason=reason)
            return
        started = self.phase != "hello"
        self.gone.discard(rank)
        repeat = time.monotonic() - self.welcomed_at.get(rank, -1e9) <= 4 * HELLO_EVERY_S  # queued HELLOs
        self.welcomed_at[rank] = time.monotonic()
        self.send(
            WELCOME,
            rank,
            resume_from=None if started else self.resume_from,
            config=self.config,
            config_sha256=self.digest,
            session=self.session,
        )
        process, before = msg.get("process"), self.process_of.get(rank)
        self.process_of[rank] = process
        if started:  # a worker that was gone is back: its next task brings it the current model
            if not repeat:
                log.info("rank %d is back (round %d)", rank, self.round_idx)
            for party in msg.get("fresh_parties") or []:
                if isinstance(party, int) and self.placement.get(party) == rank:
                    self.rounds.aggregator.algorithm.party_reset(party)
            if before is not None and process != before and rank in self.pending and rank in self.assigned:
                msg_type, params = self.assigned[rank]  # a restarted worker lost it: send it again
                log.info(
                    "rank %d restarted during the %s phase of round %d; sent its work again",
                    rank,
                    self.phase,
                    self.round_idx,
                )
                self.send(msg_type, rank, **params)
        if rank not in self.seen:
            self.seen.add(rank)
            log.info("rank %d is ready (%d of %d)", rank, len(self.seen), len(self.workers))
        if not started and self.seen == set(self.workers):
            self.next_round(self.start)

    # --- rounds --------------------------------------------------------------------------------
    def start_round(self, round_idx: int) -> None:
        self.round_idx, self.results, self.missing = round_idx, {}, []
        self.secure_reset()
        tasks: dict[int, list] = {}
        for party, payload in self.rounds.downloads(round_idx).items():
            tasks.setdefault(self.placement[party], []).append({"party": party, "payload": payload})
        self._phase("train", set(tasks))
        for rank, items in sorted(tasks.items()):
            self.assign(rank, TRAIN, round=round_idx, tasks=items)

    def on_result(self, msg: Message) -> None:
        """Take a worker's uploads for the parties this round gave it, and nothing else: each with the
        sample count the server fixed for the party and an upload that matches the algorithm's spec.
        Anything else refuses the result whole; the worker's parties count as missing."""
        if not self._expected(msg, "train"):
            return
        rank, items = msg.get_sender_id(), msg.get("results")
        if self.secure:
            self.refused(rank, "secure aggregation is on: a party's upload is never sent in the clear")
            return
        mine = {t["party"] for t in self.assigned[rank][1]["tasks"]}
        problem = result_problem(items, mine, self.rounds.samples, self.rounds.upload_spec)
        if problem is not None:
            log.error("round %d: refused rank %d's result: %s", self.round_idx, rank, problem)
            self.refused(rank, problem)
            return
        for item in items:
            self.results[item["party"]] = (float(self.rounds.samples[item["party"]]), item["upload"])
        self.pending.discard(rank)
        if not self.pending:
            self.after_train()

    def after_train(self) -> None:
        if self.secure:
            self._guard(self.secure_after_keys)
            return
        self.missing = [p for p in self.rounds.parties(self.round_idx) if p not in self.results]
        self.ordered = self.rounds.aggregate(self.round_idx, self.results)
        self.after_aggregate()

    def after_aggregate(self) -> None:
        if not self.rounds.needs_party_eval(self.round_idx):
            self.close_round(None)
            return
        alive = [r for r in self.workers if not self.is_dead(r)]
        self._phase("eval", set(alive))
        self.reports = {}
        download = self.rounds.eval_download()
        for rank in alive:
            self.assign(rank, EVAL, round=self.round_idx, payload=download)

    def on_report(self, msg: Message) -> None:
        """Take a worker's evaluation reports: one for each of its parties, as the algorithm declares."""
        if not self._expected(msg, "eval"):
            return
        rank, reports = msg.get_sender_id(), msg.get("reports")
        mine = sorted(p for p, r in self.placement.items() if r == rank)
        problem = reports_problem(reports, mine, self.rounds.personal_spec())
        if problem is not None:
            log.error("round %d: refused rank %d's report: %s", self.round_idx, rank, problem)
            self.refused(rank, problem)
            return
        for party, report in zip(mine, sorted(reports, key=lambda r: r["party_id"]), strict=True):
            self.reports[party] = report
        self.pending.discard(rank)
        if not self.pending:
            self.close_round(self.reports)

    def close_round(self, reports: dict | None) -> None:
        extra: dict[str, Any] = {
            "wire_bytes_sent": self._transport.bytes_sent,
            "wire_bytes_received": self._transport.bytes_received,
        }
        if self.missing:
            extra["missing_parties"] = self.missing
        self.rounds.finish_round(self.round_idx, self.ordered, reports, extra)
        if due(self.checkpoint_every, self.round_idx, self.rounds.rounds):
            alive = [r for r in self.workers if not self.is_dead(r)]
            self._phase("checkpoint", set(alive))
            for rank in alive:  # the workers first: the server's LATEST then implies theirs
                self.assign(rank, CHECKPOINT, round=self.round_idx)
            if not alive:
                self.write_checkpoint()
            return
        self.next_round(self.round_idx + 1)

    def on_checkpointed(self, msg: Message) -> None:
        if not self._expected(msg, "checkpoint"):
            return
        self.pending.discard(msg.get_sender_id())
        if not self.pending:
            self.write_checkpoint()

    def write_checkpoint(self) -> None:
        save(self.rounds.recorder.out_dir, self.round_idx, self.full_config, Holding(server=self.rounds))
        self.last_checkpoint = self.round_idx
        self.next_round(self.round_idx + 1)

    def next_round(self, round_idx: int) -> None:
        if round_idx < self.rounds.rounds:
            self.start_round(round_idx)
            return
        alive = [r for r in self.workers if not self.is_dead(r)]
        self._phase("finish", set(alive))
        for rank in alive:
            self.send(FINISH, rank)
        if not alive:
            self.done("completed")

    def on_bye(self, msg: Message) -> None:
        rank = msg.get_sender_id()
        if self.phase == "finish":
            self.pending.discard(rank)
            if not self.pending:
                self.done("completed")
        elif rank in self.pending:  # leaving in the middle of a round: its parties are missing
            log.warning("rank %d said BYE in the %s phase of round %d", rank, self.phase, self.round_idx)
            self.gone.add(rank)

    # --- waiting, and failures -----------------------------------------------------------------
    def on_error(self, msg: Message) -> None:
        """A worker that failed before the run started stops the run; in the middle of a run its
        parties count as missing (the quorum decides), as if it had died."""
        rank, reason = msg.get_sender_id(), str(msg.get("reason"))[:2000]
        if self.phase == "hello":
            self.fail(f"rank {rank} failed: {reason}")
            return
        log.error("rank %d failed in the %s phase of round %d: %s", rank, self.phase, self.round_idx, reason)
        self.gone.add(rank)

    def on_tick(self, msg: Message) -> None:
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
        dead = {r for r in self.pending if self.is_dead(r) or r in self.gone or r in self.out}
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
        log.info(
            "waiting for rank(s) %s %s: %.0f s so far (comm_args.%s = %g)%s",
            ranks,
            where,
            waited,
            "timeout_s" if self.phase == "hello" else "round_timeout_s",
            self.comm_args.timeout_s if self.phase == "hello" else self.deadline_s,
            f"; no heartbeat from {dead}" if dead else "",
        )

    def give_up_on(self, ranks: list[int], dead: list[int], waited: float) -> None:
        """The ranks still pending are dead, or the deadline has passed: go on without them if the
        phase allows it, else (too few reports) wait for the deadline, then stop."""
        gone = sorted(set(ranks) & (self.gone | self.out))
        why = f"rank(s) {ranks} " + (
            f"said BYE or ERROR or sent what was refused ({gone})"
            if gone and dead == ranks
            else "stopped sending heartbeats"
            if dead == ranks
            else f"silent for {waited:.0f} s"
        )
        if self.phase == "train":
            need = quorum(self.comm_args.min_reports, len(self.rounds.parties(self.round_idx)))
            if len(self.results) < need:
                if waited <= self.deadline_s:
                    return  # a dead worker may still come back before the deadline
                self.fail(
                    f"no answer from rank(s) {ranks} ({why}) for {waited:.0f} s in the train phase of round "
                    f"{self.round_idx}: {len(self.results)} parties reported, fewer than the {need} required "
                    f"(comm_args.min_reports); {self._resume_hint()}"
                )
                return
            log.warning("round %d goes on without %s: %s", self.round_idx, self._parties_of(ranks), why)
            self.pending.clear()
            self.after_train()
        elif self.phase in ("share", "mask", "unmask"):
            log.warning(
                "round %d: secure aggregation goes on without %s: %s",
                self.round_idx,
                self._parties_of(ranks),
                why,
            )
            self.pending.clear()
            self.secure_step()
        elif self.phase == "eval":
            log.warning("round %d is evaluated without %s: %s", self.round_idx, self._parties_of(ranks), why)
            self.pending.clear()
            self.close_round(self.reports)
        elif self.phase == "checkpoint":
            log.warning("checkpoint of round %d written without rank(s) %s: %s", self.round_idx, ranks, why)
            self.pending.clear()
            self.write_checkpoint()
        else:  # finish: every round is recorded
            log.warning("no BYE from rank(s) %s; finishing anyway", ranks)
            self.done("completed")

    def _parties_of(self, ranks: list[int]) -> str:
        parties = sorted(p for p, r in self.placement.items() if r in ranks)
        return f"parties {parties} (rank(s) {ranks})"

    def _resume_hint(self) -> str:
        if self.last_checkpoint is None:
            return "no checkpoint was written yet"
        out = self.rounds.recorder.out_dir
        return f"the checkpoint of round {self.last_checkpoint} is kept: go on with --resume {out}"

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

    def _expected(self, msg: Message, phase: str) -> bool:
        rank, round_idx = msg.get_sender_id(), msg.get("round")
        if self.phase != phase or round_idx != self.round_idx or rank not in self.pending:
            log.warning(
                "dropped a late %s message from rank %s for round %s", msg.get_type(), rank, round_idx
            )
            return False
        return True
