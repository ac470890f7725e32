"""The server (rank 0) of every distributed mode: hands each round's parties to the workers that hold
them, collects their results and reports, and records the round through ServerRounds."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.config_schema import CommArgs
from fedml_moon.core.checkpoint import write_checkpoint
from fedml_moon.glue.managers import (
    ABORT,
    BYE,
    CHECKPOINT,
    CHECKPOINTED,
    ERROR,
    EVAL,
    FINISH,
    HELLO,
    REPORT,
    RESULT,
    TICK,
    TRAIN,
    WELCOME,
    _Manager,
    config_differences,
)
from fedml_moon.glue.resume import checkpoint_root, due
from fedml_moon.glue.rounds import ServerRounds
from fedml_moon.glue.transport.base import QueueTransport

log = logging.getLogger(__name__)


class PluginServerManager(_Manager):
    """Rank 0: hands each round's parties to the workers that hold them, collects, records.

    A round waits for every worker it sent work to, but no longer than `comm_args.round_timeout_s`
    (default: `timeout_s`), and not for a worker whose heartbeats stopped: when the ranks still
    pending are all dead or the deadline has passed, the round goes on with the parties that
    reported if there are at least `comm_args.min_reports` of them (default: all), the others named
    in the log and in `missing_parties`; below that it waits for the deadline, then stops (the last
    checkpoint stays for --resume). A worker that comes back gets the current model with its next
    task; results of an earlier round are dropped.
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
        self.phase_started = time.monotonic()
        self.last_checkpoint: int | None = self.resume_from
        super().__init__(args, transport, 0, len(workers) + 1, comm.backend, comm.heartbeat_s)

    def peers(self) -> list[int]:
        return sorted(self.seen)

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
            self.register_message_receive_handler(msg_type, handler)

    def _phase(self, phase: str, pending: set[int]) -> None:
        self.phase, self.pending, self.phase_started = phase, set(pending), time.monotonic()

    # --- start ---------------------------------------------------------------------------------
    def on_hello(self, msg: Message) -> None:
        rank = msg.get_sender_id()
        if rank not in self.workers:
            log.warning("HELLO from rank %s, which is not a worker of this run (%s)", rank, self.workers)
            return
        differs = config_differences(self.config, msg.get("config") or {})
        if differs:
            reason = f"rank {rank}'s config differs from the server's in {', '.join(differs)}"
            log.error("%s; it is refused", reason)
            self.send(ABORT, rank, reason=reason)
            return
        started = self.phase != "hello"
        self.send(WELCOME, rank, resume_from=None if started else self.resume_from)
        if started:  # a worker that was gone is back: its next task brings it the current model
            log.info("rank %d is back (round %d)", rank, self.round_idx)
            for party in msg.get("fresh_parties") or []:
                self.rounds.aggregator.algorithm.party_reset(int(party))
        if rank not in self.seen:
            self.seen.add(rank)
            log.info("rank %d is ready (%d of %d)", rank, len(self.seen), len(self.workers))
        if not started and self.seen == set(self.workers):
            self.next_round(self.start)

    # --- rounds --------------------------------------------------------------------------------
    def start_round(self, round_idx: int) -> None:
        self.round_idx, self.results, self.missing = round_idx, {}, []
        tasks: dict[int, list] = {}
        for party, payload in self.rounds.downloads(round_idx).items():
            tasks.setdefault(self.placement[party], []).append({"party": party, "payload": payload})
        self._phase("train", set(tasks))
        for rank, items in sorted(tasks.items()):
            self.send(TRAIN, rank, round=round_idx, tasks=items)

    def on_result(self, msg: Message) -> None:
        if not self._expected(msg, "train"):
            return
        for item in msg.get("results"):
            self.results[int(item["party"])] = (float(item["n"]), item["upload"])
        self.pending.discard(msg.get_sender_id())
        if not self.pending:
            self.after_train()

    def after_train(self) -> None:
        self.missing = [p for p in self.rounds.parties(self.round_idx) if p not in self.results]
        self.ordered = self.rounds.aggregate(self.round_idx, self.results)
        if not self.rounds.needs_party_eval(self.round_idx):
            self.close_round(None)
            return
        alive = [r for r in self.workers if not self.is_dead(r)]
        self._phase("eval", set(alive))
        self.reports = {}
        download = self.rounds.eval_download()
        for rank in alive:
            self.send(EVAL, rank, round=self.round_idx, payload=download)

    def on_report(self, msg: Message) -> None:
        if not self._expected(msg, "eval"):
            return
        for report in msg.get("reports"):
            self.reports[int(report["party_id"])] = report
        self.pending.discard(msg.get_sender_id())
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
                self.send(CHECKPOINT, rank, round=self.round_idx)
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
        parts = {"config": self.full_config, "server": self.rounds.state(self.round_idx)}
        write_checkpoint(checkpoint_root(self.rounds.recorder.out_dir), self.round_idx, parts)
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
        self.pending.discard(msg.get_sender_id())
        if self.phase == "finish" and not self.pending:
            self.done("completed")

    # --- waiting, and failures -----------------------------------------------------------------
    def on_error(self, msg: Message) -> None:
        self.fail(f"rank {msg.get_sender_id()} failed: {msg.get('reason')}")

    def on_tick(self, msg: Message) -> None:
        waited = time.monotonic() - self.phase_started
        if self.phase == "hello":
            if waited > self.comm_args.timeout_s:
                missing = sorted(set(self.workers) - self.seen)
                self.fail(
                    f"no answer from rank(s) {missing} for {waited:.0f} s in the hello phase "
                    f"(comm_args.timeout_s = {self.comm_args.timeout_s:g})"
                )
            return
        if self.phase == "done" or not self.pending:
            return
        dead = {r for r in self.pending if self.is_dead(r)}
        if dead != self.pending and waited <= self.deadline_s:
            return
        self.give_up_on(sorted(self.pending), sorted(dead), waited)

    def give_up_on(self, ranks: list[int], dead: list[int], waited: float) -> None:
        """The ranks still pending are dead, or the deadline has passed: go on without them if the
        phase allows it, else (too few reports) wait for the deadline, then stop."""
        why = f"rank(s) {ranks} " + (
            "stopped sending heartbeats" if dead == ranks else f"silent for {waited:.0f} s"
        )
        if self.phase == "train":
            need = self.comm_args.min_reports or len(self.rounds.parties(self.round_idx))
            if len(self.results) < need:
                if waited <= self.deadline_s:
                    return  # a dead worker may still come back before the deadline
                self.fail(
                    f"no answer from rank(s) {ranks} for {waited:.0f} s in the train phase of round "
                    f"{self.round_idx}: {len(self.results)} parties reported, fewer than the {need} required "
                    f"(comm_args.min_reports); {self._resume_hint()}"
                )
                return
            log.warning("round %d goes on without %s: %s", self.round_idx, self._parties_of(ranks), why)
            self.pending.clear()
            self.after_train()
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
