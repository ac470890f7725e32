"""A worker (MPI simulation) or silo of every distributed mode: trains and evaluates its parties."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.config.schema import CommArgs
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
)
from fedml_moon.distributed.protocol import MASK, OPEN, ROSTER, UNMASK
from fedml_moon.distributed.silo.refusal import record_digest
from fedml_moon.distributed.silo.results import keep_final_model, log_own_figures
from fedml_moon.distributed.silo.secure import SecureWorker
from fedml_moon.distributed.silo.state import Built, Local, SiloState
from fedml_moon.distributed.silo.status import SiloStatus
from fedml_moon.distributed.silo.welcome import Welcome
from fedml_moon.distributed.transport.base import QueueTransport, TransportError
from fedml_moon.engine.parties import PartyRunner
from fedml_moon.engine.resume import flat_config, save

log = logging.getLogger(__name__)


class SiloManager(_Manager):
    """A worker (MPI simulation) or silo: trains and evaluates the parties it holds when asked.

    It builds its data and parties from the config the server's WELCOME hands it (`build`), once. When
    the server falls silent it does not stop: it says HELLO again every few seconds, for up to
    `comm_args.timeout_s`, and a WELCOME from a new server session (a restarted server) makes it load
    its own checkpoint of the round that server resumes from (or start its parties afresh when the
    server starts the run anew)."""

    def __init__(
        self,
        args: Any,
        transport: QueueTransport,
        local: Local,
        build: Callable[[dict], Built],
        rank: int,
        comm: CommArgs,
        folder: Path,
        server_address: str = "",
    ) -> None:
        self.local, self.build = local, build
        self.timeout_s, self.server_address = comm.timeout_s, server_address
        self.folder = folder  # its checkpoints: <folder>/checkpoint/ (engine.resume)
        self.process = secrets.token_hex(8)  # this process: a restarted worker is told its work again
        self.state = SiloState()
        self.secure = SecureWorker(self)
        self.status_board = SiloStatus(self)
        self.welcome = Welcome(self)
        super().__init__(args, transport, rank, 0, comm.backend, comm.heartbeat_s)

    @property
    def runner(self) -> PartyRunner:
        assert self.state.built is not None, "the server's WELCOME builds the parties first"
        return self.state.built.runner

    @property
    def parties(self) -> list[int]:
        return self.state.built.parties if self.state.built is not None else self.local.parties

    def peers(self) -> list[int]:
        """Heartbeats go to the server from the first HELLO on, through building the data and parties
        after WELCOME (which can take longer than three heartbeat periods), to the last message."""
        return [0] if self.state.said_hello else []

    def trusted(self, sender: int) -> bool:
        """A worker takes messages from the server (rank 0) and its own timer only: another silo that
        sends it ABORT, WELCOME or REJOIN under its own rank is refused."""
        return sender in (0, self.rank)

    def trusted_description(self) -> str:
        return "the server (rank 0) and its own timer"

    def register_message_receive_handlers(self) -> None:
        for msg_type, handler in (
            (WELCOME, self.welcome.on_welcome),
            (TRAIN, self.on_train),
            (EVAL, self.on_eval),
            (FINISH, self.on_finish),
            (ABORT, self.on_abort),
            (CHECKPOINT, self.on_checkpoint),
            (REJOIN, self.on_rejoin),
            (TICK, self.on_tick),
            (OPEN, self.secure.on_sa_open),  # a buffered run's secure sum (server/buffered_secure.py)
            (ROSTER, self.secure.on_sa_roster),  # secure aggregation's rounds (server/secure.py)
            (MASK, self.secure.on_sa_mask),
            (UNMASK, self.secure.on_sa_unmask),
        ):
            self.register_message_receive_handler(msg_type, self._guarded(handler))

    def _guarded(self, handler):
        def run(msg: Message) -> None:
            if self.state.stopped:  # what was queued before it stopped: its status and reason stay
                return
            try:
                handler(msg)
            except TransportError as err:  # the server cannot be reached: telling it is pointless
                self.state.reason = f"the server cannot be reached: {err}"
                log.error("rank %d stops: %s", self.rank, self.state.reason)
                self.stop("failed")
            except Exception as err:
                log.exception("rank %d failed", self.rank)
                self.state.reason = f"{type(err).__name__}: {err}"
                try:  # the kind of failure only: its message may name the site's files (its log has it)
                    self.send(ERROR, 0, reason=f"{type(err).__name__} (rank {self.rank}'s log says more)")
                except Exception as send_err:
                    log.info("rank %d could not tell the server: %s", self.rank, send_err)
                finally:
                    self.stop("failed")

        return run

    def hello(self) -> None:
        """Say which parties this process holds, its config and the settings it set itself, and the
        parties that hold no state (a silo that lost its state; the server then treats them as new)."""
        self.state.last_hello = time.monotonic()
        config = self.state.built.config if self.state.built is not None else self.local.config
        fresh = (
            [p for p in self.parties if not self.runner.trainer.store.get(p)]
            if self.state.built is not None
            else self.local.fresh()
        )
        msg = Message(HELLO, self.rank, 0)
        params = {"parties": self.parties, "config": config, "explicit": self.local.explicit}
        for key, value in {**params, "fresh_parties": fresh, "process": self.process}.items():
            msg.add_params(key, value)
        # said again every HELLO_EVERY_S until welcomed: never wait long for a server not up yet (the
        # main thread would not tick, nor say that it waits)
        if not self._transport.try_send(msg, HELLO_EVERY_S):
            log.debug("rank %d: the server did not take its HELLO yet", self.rank)
        self.state.said_hello = True

    # --- waiting for the server, losing it, finding it again ----------------------------------------
    def on_tick(self, msg: Message) -> None:
        now = time.monotonic()
        if self.state.welcomed and self.is_dead(0):
            self.lose_server(now)
        self.status_board.publish()
        if self.state.welcomed:
            self.say_waiting_to_start(now)
            return
        waited = now - self.state.waiting_since
        if waited >= self.timeout_s:
            self.state.reason = f"no answer from the server (rank 0) for {waited:.0f} s (comm_args.timeout_s)"
            log.error("rank %d stops: %s", self.rank, self.state.reason)
            self.stop("failed")
            return
        if now - self.state.last_wait_log >= self.wait_log_every_s:
            self.state.last_wait_log = now
            log.info(
                "rank %d is waiting for the server (rank 0%s): %.0f s of comm_args.timeout_s = %g",
                self.rank,
                self._at(),
                waited,
                self.timeout_s,
            )
        if now - self.state.last_hello >= HELLO_EVERY_S:
            self.hello()

    def say_waiting_to_start(self, now: float) -> None:
        """Welcomed and ready, before its first task: say what it waits for, now and then."""
        if (
            self.state.built is None
            or self.state.trained
            or now - self.state.last_wait_log < self.wait_log_every_s
        ):
            return
        self.state.last_wait_log = now
        log.info(
            "rank %d is ready and waits for its first task: the run's first round starts once every site "
            "is ready (%.0f s so far)",
            self.rank,
            now - self.state.waiting_since,
        )

    def on_rejoin(self, msg: Message) -> None:
        """A server process that has not welcomed this worker (a restarted server) asks for a HELLO."""
        if self.state.welcomed:
            self.lose_server(time.monotonic(), "a new server process asked it to say hello again")
        self.hello()

    def lose_server(self, now: float, why: str = "") -> None:
        """The server's heartbeats stopped: keep saying hello until a server welcomes this worker again."""
        why = why or f"the server (rank 0) sent no heartbeat for {self.silent_for(0):.0f} s"
        log.warning(
            "rank %d: %s; waiting up to %g s (comm_args.timeout_s) for a server to welcome it (restart a "
            "dead server with --resume to go on from its checkpoint)",
            self.rank,
            why,
            self.timeout_s,
        )
        self.state.welcomed = False
        self.last_seen.pop(0, None)
        self.state.waiting_since = self.state.last_wait_log = now
        self.state.last_hello = 0.0
        self.status_board.publish("waiting for the server")

    # --- work ------------------------------------------------------------------------------------
    def on_checkpoint(self, msg: Message) -> None:
        round_idx, built = int(msg.get("round")), self.state.built
        if built is None:
            log.warning("rank %d dropped a checkpoint request sent before its WELCOME", self.rank)
            return
        config = flat_config(built.run_config)
        save(self.folder, round_idx, config, built.holding(), keep=2)  # the server may still need the older
        self.send(CHECKPOINTED, 0, round=round_idx)

    def on_train(self, msg: Message) -> None:
        if self.state.built is None:
            log.warning("rank %d dropped a task sent before its WELCOME", self.rank)
            return
        built = self.state.built
        if not self.state.data_recorded and built.data_sha256:  # its data are this run's from its first task
            record_digest(self.folder, built.data_sha256)
            self.state.data_recorded = True
        self.state.welcomed, self.state.trained_since_welcome = True, True
        round_idx, tasks = int(msg.get("round")), msg.get("tasks")
        self.status_board.trains(round_idx)
        trained = self.runner.train_many([(int(t["party"]), t["payload"]) for t in tasks], round_idx)
        self.state.trained += 1
        config = built.run_config
        if config.device_args.delay_per_round_s:  # its own setting: a slower machine's pace, each round
            delay = config.device_args.delay_per_round_s * len(tasks)
            log.info("rank %d waits %g s before it answers (device_args.delay_per_round_s)", self.rank, delay)
            time.sleep(delay)
        if config.privacy_args.secure_aggregation and config.server_args.aggregation == "buffered":
            self.secure.secure_hold(round_idx, tasks, trained)  # until the buffer's session (buffered_secure)
        elif config.privacy_args.secure_aggregation:
            self.secure.secure_train(round_idx, tasks, trained)
        else:
            results = [
                {"party": int(t["party"]), "n": int(n), "upload": u}
                for t, (n, u) in zip(tasks, trained, strict=True)
            ]
            self.send(RESULT, 0, round=round_idx, results=results)
        self.status_board.publish("waiting for the next round")

    def on_eval(self, msg: Message) -> None:
        """Evaluate its parties' own models and report. Under secure aggregation only the counts of a
        secure sum (`secure: true`, no local test): anything else would reach the server in the clear."""
        payload = msg.get("payload")
        if self.state.built is None:
            self.refusals.refused("rank 0", f"rank {self.rank} refused an EVAL request before its WELCOME")
            return
        secure = self.state.built.run_config.privacy_args.secure_aggregation
        if secure and not (payload.get("secure") is True and payload.get("local") is False):
            why = "that would reach the server in the clear under privacy_args.secure_aggregation"
            self.refusals.refused("rank 0", f"rank {self.rank} refused an EVAL request {why}")
            return
        wanted = payload.get("parties")  # validation_args.eval_parties: a sample of the parties
        if wanted is not None and not (isinstance(wanted, list) and all(type(p) is int for p in wanted)):
            why = "whose parties are not party ids"
            self.refusals.refused("rank 0", f"rank {self.rank} refused an EVAL request {why}")
            return
        asked = None if wanted is None else set(wanted)
        self.status_board.publish("evaluating", int(msg.get("round")))
        reports = [self.runner.evaluate(p, payload) for p in self.parties if asked is None or p in asked]
        log_own_figures(self.rank, int(msg.get("round")), reports)  # its own: under secure aggregation too
        self.status_board.publish("waiting for the next round")
        if secure:
            self.secure.secure_eval(int(msg.get("round")), reports, list(payload["test"]))
            return
        self.send(REPORT, 0, round=int(msg.get("round")), reports=reports)

    def on_finish(self, msg: Message) -> None:
        """The run is over: keep the final global model the server sent (`<folder>/final_model.pt`)."""
        keep_final_model(self.rank, self.folder, msg.get("model"))
        self.send(BYE, 0)
        self.stop("completed")

    def on_abort(self, msg: Message) -> None:
        self.state.reason = str(msg.get("reason"))
        log.error("rank %d: the server stopped the run: %s", self.rank, self.state.reason)
        self.stop("failed")

    def run(self) -> None:
        log.info("rank %d: saying hello to the server (rank 0%s)", self.rank, self._at())
        self.hello()
        super().run()

    def _at(self) -> str:
        return f" at {self.server_address}" if self.server_address else ""

    def stop(self, status: str) -> None:
        self.status, self.state.stopped = status, True
        self.status_board.publish("finished" if status == "completed" else status)
        self.finish()
