"""The protocol of the plugin's FedML managers (FedMLCommManager subclasses in server/manager.py and
silo/manager.py), one for every distributed mode: MPI simulation, cross-silo over MPI or gRPC, MQTT + S3.

    worker/silo -> server   HELLO {parties, config, explicit, fresh_parties, process}   (until WELCOME)
    server -> worker        WELCOME {config, config_sha256, session, resume_from}
    worker -> server        READY {claims: [{party, claim}]}  (its data built: what each party holds)
                            or REFUSE {kind, key}  (it refuses its own data: silo/refusal.py; it stops)
    server -> worker        TRAIN {round, tasks: [{party, payload}]}
    worker -> server        RESULT {round, results: [{party, n, upload}]}
    server -> worker        EVAL {round, payload}           (evaluation rounds that need the parties)
    worker -> server        REPORT {round, reports: [...]}
    server -> worker        CHECKPOINT {round} (rounds that are due) ... worker -> server CHECKPOINTED
    server -> worker        FINISH {model} (after the last round: the final global model) / ABORT {reason}
    server -> worker        REJOIN (to a worker that is not one of its own yet, e.g. after a restart)
    worker -> server        BYE, or ERROR {reason}   (the reason: the exception's type; its log says more)

Every message is checked against its declaration in protocol.py before its handler runs; a message
that does not fit is refused (logged with the sender and the field), and the server counts the silo
as missing in that phase. A READY's claims (engine/claims.py) must equal what the server computed
where it partitioned the data itself, else they are all it knows of the party (bounded, and fixed
for the run when first made); `n` is the party's sample count, which must equal its claim.

The server's side of a round is `ServerRounds`, the parties' side `PartyRunner`: the same objects the
standalone loop drives. A timer posts TICK messages into each process's own queue; handlers run in
the main thread only. `comm_args.timeout_s` bounds every wait: the server names the ranks it waits for,
a worker names the silent server.

The run's config is the server's: WELCOME hands every worker the server's shared settings (the keys of
`deploy.shared_config`) with their SHA-256; a worker builds its data and parties from them, so `--set`
values given to the server need not be repeated. Settings a worker sets itself with `--set` must agree
with the server's, or it is refused with the keys named. `session` names one server process: a worker
that lost its server keeps saying HELLO (within `comm_args.timeout_s`) and, welcomed by a new session,
loads its checkpoint of the round the resumed server goes on from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import MutableMapping
from typing import Any

from fedml.core.distributed.communication.message import Message
from fedml.core.distributed.fedml_comm_manager import FedMLCommManager

from fedml_moon.core.schedule import quorum  # noqa: F401 (the managers' name for it)
from fedml_moon.distributed.protocol import (  # noqa: F401 (the protocol's names, for the managers)
    ABORT,
    BYE,
    CHECKPOINT,
    CHECKPOINTED,
    ERROR,
    EVAL,
    FINISH,
    HEARTBEAT,
    HELLO,
    READY,
    REFUSE,
    REJOIN,
    REPORT,
    RESULT,
    TICK,
    TRAIN,
    WELCOME,
    message_problem,
)
from fedml_moon.distributed.transport.base import QueueTransport
from fedml_moon.status.refusals import RefusalLog, bounded

log = logging.getLogger(__name__)
DEAD_AFTER_BEATS = 3  # a peer silent for this many heartbeat periods is taken for dead
HELLO_EVERY_S = 2.0
WAIT_LOG_MIN_S = 5.0  # a process that waits says so every max(this, 6 heartbeat periods)


class _Manager(FedMLCommManager):
    """Wires a plugin transport into FedML's manager; dispatches messages; runs a TICK timer."""

    def __init__(
        self,
        args: Any,
        transport: QueueTransport,
        rank: int,
        size: int,
        backend: str,
        heartbeat_s: float = 5.0,
        last_seen: MutableMapping[int, float] | None = None,
    ) -> None:
        self._transport = transport
        self.refusals = RefusalLog(log)
        self.status = "failed"
        self._ticking = True
        self.heartbeat_s = heartbeat_s
        # rank -> when a message of it was last handled here (the server keeps it in its sites' records)
        self.last_seen: MutableMapping[int, float] = {} if last_seen is None else last_seen
        super().__init__(args, comm=None, rank=rank, size=size, backend=backend)

    @property
    def transport(self) -> QueueTransport:
        """The plugin's transport this manager sends and receives through."""
        return self._transport

    def peers(self) -> list[int]:
        """The ranks this process sends heartbeats to."""
        return []

    @property
    def wait_log_every_s(self) -> float:
        return max(WAIT_LOG_MIN_S, 6 * self.heartbeat_s)

    def silent_for(self, rank: int) -> float:
        """Seconds since `rank` was last heard: a message of it handled here or, whatever the main
        thread was doing (a long local round), received by the transport's threads."""
        heard = max(self.last_seen.get(rank, 0.0), self._transport.heard.get(rank, 0.0))
        return time.monotonic() - heard

    def heard_at(self, rank: int) -> float | None:
        """When `rank` was last heard, in seconds since 1970 (for a status file); None: never."""
        if rank not in self.last_seen and rank not in self._transport.heard:
            return None
        return time.time() - self.silent_for(rank)

    def is_dead(self, rank: int) -> bool:
        return rank in self.last_seen and self.silent_for(rank) > DEAD_AFTER_BEATS * self.heartbeat_s

    def alive_before(self, pause_s: float) -> list[int]:
        """The peers that were alive when a pause of `pause_s` seconds began (a grace renews only
        theirs: a peer already dead before it stays dead, however often the process is starved)."""
        window = DEAD_AFTER_BEATS * self.heartbeat_s
        return [rank for rank in list(self.last_seen) if self.silent_for(rank) - pause_s <= window]

    def _heartbeat_loop(self) -> None:
        """From its own thread, so a process busy training still shows it is alive."""
        while self._ticking:
            time.sleep(self.heartbeat_s)
            for rank in self.peers():
                try:
                    self.send(HEARTBEAT, rank)
                except Exception as err:  # the peer may be gone; its silence is noticed elsewhere
                    log.debug("rank %d: heartbeat to rank %d failed: %s", self.rank, rank, err)

    def _init_manager(self) -> None:  # FedML's own backends un-pickle and spin: use the plugin's
        self.com_manager = self._transport
        self.com_manager.add_observer(self)

    def receive_message(self, msg_type: Any, msg_params: Message) -> None:
        """Check the message against its declaration (protocol.py) and its sender, then hand it to its
        handler. Every field is type-checked before it is used as a key or a dispatch value; what is
        refused is logged (bounded, rate-limited per sender) and changes nothing else."""
        sender = msg_params.get_sender_id()
        problem = message_problem(msg_type, msg_params.get_params())
        if problem is None and (msg_type == TICK) != (sender == self.rank):
            problem = "only a process's own timer sends TICK, and only to itself"
        if problem is None and not self.trusted(sender):
            problem = f"rank {self.rank} takes messages from {self.trusted_description()} only"
        handler = self.message_handler_dict.get(msg_type) if problem is None else None
        if problem is None and handler is None and msg_type != HEARTBEAT:
            problem = f"rank {self.rank} takes no {msg_type} message"
        if problem is not None:
            # escaped: a type of the sender's choosing must not start a line of this log of its own
            kind = ascii(str(msg_type)[:40])[1:-1] if isinstance(msg_type, str) else type(msg_type).__name__
            self.count_refusal(sender)
            self.refusals.refused(
                f"rank {sender}",
                f"rank {self.rank} refused a {kind} message from rank {sender}: {problem}",
                reason=f"{kind}: {problem[:50]}",
            )
            return
        if sender != self.rank:
            self.last_seen[sender] = time.monotonic()
        if msg_type != HEARTBEAT:
            handler(msg_params)

    def trusted(self, sender: int) -> bool:
        """Whether `sender`'s messages may reach this process's handlers (this process itself)."""
        return sender == self.rank

    def trusted_description(self) -> str:
        return "its own timer"

    def refused(self, sender: int, problem: str) -> None:
        """A message from `sender` was refused (already logged)."""

    def count_refusal(self, sender: int) -> None:
        """A message from `sender` is refused: the server counts it in the sender's record."""

    def send(self, msg_type: str, receiver: int, **params: Any) -> None:
        msg = Message(msg_type, self.rank, receiver)
        for key, value in params.items():
            msg.add_params(key, value)
        self.send_message(msg)

    def _tick_loop(self) -> None:
        last = time.monotonic()
        while self._ticking:
            time.sleep(1.0)
            now = time.monotonic()
            if now - last > 3.0:  # this process itself was stopped or starved: give its peers a grace
                log.warning(
                    "rank %d was paused for %.0f s; peers get a fresh heartbeat window", self.rank, now - last
                )
                self.last_seen.update((rank, now) for rank in self.alive_before(now - last))
            last = now
            self._transport.post(Message(TICK, self.rank, self.rank))

    def run(self) -> None:
        threading.Thread(target=self._tick_loop, name=f"tick-{self.rank}", daemon=True).start()
        threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.rank}", daemon=True).start()
        try:
            super().run()
        finally:
            self._ticking = False
            if self._transport.running:  # a failure left it open: its threads would keep the process alive
                self._transport.stop_receive_message()

    def finish(self) -> None:
        self._ticking = False
        self.com_manager.stop_receive_message()


def config_differences(ours: dict, theirs: dict) -> list[str]:
    """Dotted keys whose values differ between two `shared_config` dicts (sorted)."""
    keys = set(ours) | set(theirs)
    return sorted(k for k in keys if ours.get(k) != theirs.get(k))


def described_differences(ours: dict, theirs: dict, keys: list[str]) -> str:
    """`key (A here, B on the server)` for each of `keys`."""
    return ", ".join(
        f"{k} ({bounded(repr(theirs.get(k)), 120)} here, {bounded(repr(ours.get(k)), 120)} on the server)"
        for k in keys
    )


def config_digest(shared: dict) -> str:
    """SHA-256 of a `shared_config` dict in canonical JSON (sorted keys): equal digests, equal settings."""
    text = json.dumps(shared, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()
