"""A worker (MPI simulation) or silo of every distributed mode: trains and evaluates its parties."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.config_schema import CommArgs
from fedml_moon.core.checkpoint import read_checkpoint, write_checkpoint
from fedml_moon.glue.managers import (
    ABORT,
    BYE,
    CHECKPOINT,
    CHECKPOINTED,
    ERROR,
    EVAL,
    FINISH,
    HELLO,
    HELLO_EVERY_S,
    REPORT,
    RESULT,
    TICK,
    TRAIN,
    WELCOME,
    _Manager,
    config_differences,
)
from fedml_moon.glue.trainer import PartyRunner
from fedml_moon.glue.transport.base import QueueTransport

log = logging.getLogger(__name__)


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
        comm: CommArgs,
        checkpoint_dir: Path,
    ) -> None:
        self.runner, self.parties, self.config, self.timeout_s = (
            runner,
            sorted(parties),
            config,
            comm.timeout_s,
        )
        self.welcomed, self.last_hello, self.restored = False, 0.0, False
        self.checkpoint_dir = checkpoint_dir
        self.started = time.monotonic()
        self.reason = ""
        super().__init__(args, transport, rank, 0, comm.backend, comm.heartbeat_s)

    def peers(self) -> list[int]:
        return [0] if self.welcomed else []

    def register_message_receive_handlers(self) -> None:
        for msg_type, handler in (
            (WELCOME, self.on_welcome),
            (TRAIN, self.on_train),
            (EVAL, self.on_eval),
            (FINISH, self.on_finish),
            (ABORT, self.on_abort),
            (CHECKPOINT, self.on_checkpoint),
            (TICK, self.on_tick),
        ):
            self.register_message_receive_handler(msg_type, self._guarded(handler))

    def _guarded(self, handler):
        def run(msg: Message) -> None:
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
        """Say which parties this process holds, with the config and the parties that hold no state
        yet (a silo that lost its state; the server then treats them as new)."""
        self.last_hello = time.monotonic()
        fresh = [p for p in self.parties if not self.runner.trainer.store.get(p)]
        self.send(HELLO, 0, parties=self.parties, config=self.config, fresh_parties=fresh)

    def on_tick(self, msg: Message) -> None:
        now = time.monotonic()
        if not self.welcomed and now - self.last_hello >= HELLO_EVERY_S:
            self.hello()
        if not self.welcomed and now - self.started >= self.timeout_s:
            self.reason = (
                f"no answer from the server (rank 0) for {now - self.started:.0f} s (comm_args.timeout_s)"
            )
        elif self.welcomed and self.is_dead(0):
            self.reason = (
                f"the server (rank 0) sent no heartbeat for {self.silent_for(0):.0f} s; it is taken for dead"
            )
        else:
            return
        log.error("rank %d stops: %s", self.rank, self.reason)
        self.stop("failed")

    def on_welcome(self, msg: Message) -> None:
        """The server goes on from its checkpoint of round `resume_from`: restore ours of that round."""
        self.welcomed = True
        resume_from = msg.get("resume_from")
        if resume_from is None or self.restored:
            return
        saved = read_checkpoint(self.checkpoint_dir, int(resume_from), ("config", "parties"))
        differs = config_differences(self.config, saved["config"])
        if differs:
            raise ValueError(
                f"its checkpoint of round {resume_from} has another config: {', '.join(differs)}"
            )
        self.runner.load_state(saved["parties"])
        self.restored = True
        log.info("rank %d resumed its parties from the checkpoint of round %s", self.rank, resume_from)

    def on_checkpoint(self, msg: Message) -> None:
        round_idx = int(msg.get("round"))
        parts = {"config": self.config, "parties": self.runner.state(self.parties)}
        write_checkpoint(self.checkpoint_dir, round_idx, parts, keep=2)  # the server may still need the older
        self.send(CHECKPOINTED, 0, round=round_idx)

    def on_train(self, msg: Message) -> None:
        self.welcomed = True
        round_idx, tasks = int(msg.get("round")), msg.get("tasks")
        trained = self.runner.train_many([(int(t["party"]), t["payload"]) for t in tasks], round_idx)
        results = [
            {"party": int(t["party"]), "n": n, "upload": u} for t, (n, u) in zip(tasks, trained, strict=True)
        ]
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
