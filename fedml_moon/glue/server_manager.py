"""The server (rank 0) of every distributed mode: hands each round's parties to the workers that hold
them, collects their results and reports, and records the round through ServerRounds."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml.core.distributed.communication.message import Message

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
    """Rank 0: hands each round's parties to the workers that hold them, collects, records."""

    def __init__(
        self,
        args: Any,
        transport: QueueTransport,
        rounds: ServerRounds,
        placement: dict[int, int],
        workers: list[int],
        config: dict,
        timeout_s: float,
        backend: str,
        checkpoint: tuple[int, dict] = (0, {}),
        start_round: int = 0,
    ) -> None:
        self.rounds, self.placement, self.workers = rounds, placement, list(workers)
        self.config, self.timeout_s = config, timeout_s
        self.checkpoint_every, self.full_config = checkpoint
        self.start = start_round
        self.resume_from = start_round - 1 if start_round > 0 else None
        self.seen: set[int] = set()
        self.round_idx, self.pending, self.phase = -1, set(), "hello"
        self.results: dict[int, Any] = {}
        self.reports: dict[int, Any] = {}
        self.ordered: list = []
        self.last_progress = time.monotonic()
        super().__init__(args, transport, 0, len(workers) + 1, backend)

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
        self.send(WELCOME, rank, resume_from=self.resume_from)
        if rank not in self.seen:
            self.seen.add(rank)
            log.info("rank %d is ready (%d of %d)", rank, len(self.seen), len(self.workers))
            self.last_progress = time.monotonic()
        if self.phase == "hello" and self.seen == set(self.workers):
            self.next_round(self.start)

    # --- rounds --------------------------------------------------------------------------------
    def start_round(self, round_idx: int) -> None:
        self.round_idx, self.phase, self.results = round_idx, "train", {}
        tasks: dict[int, list] = {}
        for party, payload in self.rounds.downloads(round_idx).items():
            tasks.setdefault(self.placement[party], []).append({"party": party, "payload": payload})
        self.pending = set(tasks)
        for rank, items in sorted(tasks.items()):
            self.send(TRAIN, rank, round=round_idx, tasks=items)
        self.last_progress = time.monotonic()

    def on_result(self, msg: Message) -> None:
        if not self._expected(msg, "train"):
            return
        for item in msg.get("results"):
            self.results[int(item["party"])] = (float(item["n"]), item["upload"])
        self._progress(msg.get_sender_id())
        if self.pending:
            return
        self.ordered = self.rounds.aggregate(self.round_idx, self.results)
        if not self.rounds.needs_party_eval(self.round_idx):
            self.close_round(None)
            return
        self.phase, self.reports, self.pending = "eval", {}, set(self.workers)
        download = self.rounds.eval_download()
        for rank in self.workers:
            self.send(EVAL, rank, round=self.round_idx, payload=download)

    def on_report(self, msg: Message) -> None:
        if not self._expected(msg, "eval"):
            return
        for report in msg.get("reports"):
            self.reports[int(report["party_id"])] = report
        self._progress(msg.get_sender_id())
        if not self.pending:
            self.close_round(self.reports)

    def close_round(self, reports: dict | None) -> None:
        wire = {
            "wire_bytes_sent": self._transport.bytes_sent,
            "wire_bytes_received": self._transport.bytes_received,
        }
        self.rounds.finish_round(self.round_idx, self.ordered, reports, wire)
        if due(self.checkpoint_every, self.round_idx, self.rounds.rounds):
            self.phase, self.pending = "checkpoint", set(self.workers)
            for rank in self.workers:  # the workers first: the server's LATEST then implies theirs
                self.send(CHECKPOINT, rank, round=self.round_idx)
            return
        self.next_round(self.round_idx + 1)

    def on_checkpointed(self, msg: Message) -> None:
        if not self._expected(msg, "checkpoint"):
            return
        self._progress(msg.get_sender_id())
        if not self.pending:
            parts = {"config": self.full_config, "server": self.rounds.state(self.round_idx)}
            write_checkpoint(checkpoint_root(self.rounds.recorder.out_dir), self.round_idx, parts)
            self.next_round(self.round_idx + 1)

    def next_round(self, round_idx: int) -> None:
        if round_idx < self.rounds.rounds:
            self.start_round(round_idx)
            return
        self.phase, self.pending = "finish", set(self.workers)
        for rank in self.workers:
            self.send(FINISH, rank)

    def on_bye(self, msg: Message) -> None:
        self.pending.discard(msg.get_sender_id())
        if self.phase == "finish" and not self.pending:
            self.done("completed")

    # --- failures ------------------------------------------------------------------------------
    def on_error(self, msg: Message) -> None:
        self.fail(f"rank {msg.get_sender_id()} failed: {msg.get('reason')}")

    def on_tick(self, msg: Message) -> None:
        waited = time.monotonic() - self.last_progress
        if waited < self.timeout_s:
            return
        if self.phase == "finish":  # every round is recorded; a silo that did not say goodbye
            log.warning("no BYE from rank(s) %s; finishing anyway", sorted(self.pending))
            self.done("completed")
            return
        missing = sorted(self.pending) if self.phase != "hello" else sorted(set(self.workers) - self.seen)
        self.fail(
            f"no answer from rank(s) {missing} for {waited:.0f} s in the {self.phase} phase of round "
            f"{max(self.round_idx, 0)} (comm_args.timeout_s = {self.timeout_s:g})"
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

    def _expected(self, msg: Message, phase: str) -> bool:
        rank, round_idx = msg.get_sender_id(), msg.get("round")
        if self.phase != phase or round_idx != self.round_idx or rank not in self.pending:
            log.warning("dropped a %s message from rank %s for round %s", msg.get_type(), rank, round_idx)
            return False
        return True

    def _progress(self, rank: int) -> None:
        self.pending.discard(rank)
        self.last_progress = time.monotonic()
