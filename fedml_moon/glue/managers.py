"""The plugin's FedML client and server managers (FedMLCommManager subclasses), one protocol for
every distributed mode: MPI simulation, cross-silo over MPI or gRPC, edge devices over MQTT + S3.

    worker/silo -> server   HELLO {parties, config}        (repeated until WELCOME)
    server -> worker        TRAIN {round, tasks: [{party, payload}]}
    worker -> server        RESULT {round, results: [{party, n, upload}]}
    server -> worker        EVAL {round, payload}           (evaluation rounds that need the parties)
    worker -> server        REPORT {round, reports: [...]}
    server -> worker        FINISH (after the last round) / ABORT {reason}
    worker -> server        BYE, or ERROR {reason}

The server's side of a round is `ServerRounds`, the parties' side `PartyRunner`: the same objects the
standalone loop drives. A timer posts TICK messages into each process's own queue; handlers run in
the main thread only. `comm_args.timeout_s` bounds every wait: the server names the ranks it waits for,
a worker names the silent server.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fedml.core.distributed.communication.message import Message
from fedml.core.distributed.fedml_comm_manager import FedMLCommManager

from fedml_moon.glue.rounds import ServerRounds
from fedml_moon.glue.trainer import PartyRunner
from fedml_moon.glue.transport.base import QueueTransport

log = logging.getLogger(__name__)
HELLO, WELCOME, TRAIN, RESULT, EVAL, REPORT = "hello", "welcome", "train", "result", "eval", "report"
FINISH, ABORT, BYE, ERROR, TICK = "finish", "abort", "bye", "error", "tick"
HELLO_EVERY_S = 2.0


class _Manager(FedMLCommManager):
    """Wires a plugin transport into FedML's manager; dispatches messages; runs a TICK timer."""

    def __init__(self, args: Any, transport: QueueTransport, rank: int, size: int, backend: str) -> None:
        self._transport = transport
        self.status = "failed"
        self._ticking = True
        super().__init__(args, comm=None, rank=rank, size=size, backend=backend)

    def _init_manager(self) -> None:  # FedML's own backends un-pickle and spin: use the plugin's
        self.com_manager = self._transport
        self.com_manager.add_observer(self)

    def receive_message(self, msg_type: Any, msg_params: Message) -> None:
        handler = self.message_handler_dict.get(msg_type)
        if handler is None:
            log.warning(
                "rank %d ignored a %r message from rank %s", self.rank, msg_type, msg_params.get_sender_id()
            )
            return
        handler(msg_params)

    def send(self, msg_type: str, receiver: int, **params: Any) -> None:
        msg = Message(msg_type, self.rank, receiver)
        for key, value in params.items():
            msg.add_params(key, value)
        self.send_message(msg)

    def _tick_loop(self) -> None:
        while self._ticking:
            time.sleep(1.0)
            self._transport.post(Message(TICK, self.rank, self.rank))

    def run(self) -> None:
        threading.Thread(target=self._tick_loop, name=f"tick-{self.rank}", daemon=True).start()
        try:
            super().run()
        finally:
            self._ticking = False

    def finish(self) -> None:
        self._ticking = False
        self.com_manager.stop_receive_message()


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
    ) -> None:
        self.rounds, self.placement, self.workers = rounds, placement, list(workers)
        self.config, self.timeout_s = config, timeout_s
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
        self.send(WELCOME, rank)
        if rank not in self.seen:
            self.seen.add(rank)
            log.info("rank %d is ready (%d of %d)", rank, len(self.seen), len(self.workers))
            self.last_progress = time.monotonic()
        if self.phase == "hello" and self.seen == set(self.workers):
            self.start_round(0)

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
        if self.round_idx + 1 < self.rounds.rounds:
            self.start_round(self.round_idx + 1)
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


class PluginClientManager(_Manager):
    """A worker (MPI simulation) or silo: trains and evaluates the parties it holds when asked."""

    def __init__(
        self,
        args: Any,
        transport: QueueTransport,
        runner: PartyRunner,
        parties: list[int],
        rank: int,
        config: dict,
        timeout_s: float,
        backend: str,
    ) -> None:
        self.runner, self.parties, self.config, self.timeout_s = runner, sorted(parties), config, timeout_s
        self.welcomed, self.last_hello = False, 0.0
        self.last_heard = time.monotonic()
        self.reason = ""
        super().__init__(args, transport, rank, 0, backend)

    def register_message_receive_handlers(self) -> None:
        for msg_type, handler in (
            (WELCOME, self.on_welcome),
            (TRAIN, self.on_train),
            (EVAL, self.on_eval),
            (FINISH, self.on_finish),
            (ABORT, self.on_abort),
            (TICK, self.on_tick),
        ):
            self.register_message_receive_handler(msg_type, self._guarded(handler))

    def _guarded(self, handler):
        def run(msg: Message) -> None:
            if msg.get_type() != TICK:
                self.last_heard = time.monotonic()
            try:
                handler(msg)
            except Exception as err:
                log.exception("rank %d failed", self.rank)
                self.reason = f"{type(err).__name__}: {err}"
                try:
                    self.send(ERROR, 0, reason=self.reason)
                finally:
                    self.stop("failed")

        return run

    def hello(self) -> None:
        self.last_hello = time.monotonic()
        self.send(HELLO, 0, parties=self.parties, config=self.config)

    def on_tick(self, msg: Message) -> None:
        now = time.monotonic()
        if not self.welcomed and now - self.last_hello >= HELLO_EVERY_S:
            self.hello()
        if now - self.last_heard >= self.timeout_s:
            self.reason = (
                f"no message from the server (rank 0) for {now - self.last_heard:.0f} s (comm_args.timeout_s)"
            )
            log.error("rank %d stops: %s", self.rank, self.reason)
            self.stop("failed")

    def on_welcome(self, msg: Message) -> None:
        self.welcomed = True

    def on_train(self, msg: Message) -> None:
        self.welcomed = True
        round_idx, results = int(msg.get("round")), []
        for task in msg.get("tasks"):
            n, upload = self.runner.train(int(task["party"]), task["payload"], round_idx)
            results.append({"party": int(task["party"]), "n": n, "upload": upload})
        self.send(RESULT, 0, round=round_idx, results=results)

    def on_eval(self, msg: Message) -> None:
        reports = [self.runner.evaluate(p, msg.get("payload")) for p in self.parties]
        self.send(REPORT, 0, round=int(msg.get("round")), reports=reports)

    def on_finish(self, msg: Message) -> None:
        self.send(BYE, 0)
        self.stop("completed")

    def on_abort(self, msg: Message) -> None:
        self.reason = str(msg.get("reason"))
        log.error("rank %d: the server stopped the run: %s", self.rank, self.reason)
        self.stop("failed")

    def run(self) -> None:
        log.info("rank %d holds parties %s; saying hello to the server", self.rank, self.parties)
        self.hello()
        super().run()

    def stop(self, status: str) -> None:
        self.status = status
        self.finish()


def config_differences(ours: dict, theirs: dict) -> list[str]:
    """Dotted keys whose values differ between two `shared_config` dicts (sorted)."""
    keys = set(ours) | set(theirs)
    return sorted(k for k in keys if ours.get(k) != theirs.get(k))
