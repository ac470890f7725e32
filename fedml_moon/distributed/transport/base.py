"""What every transport shares: Message <-> bytes, and a receive queue the main thread blocks on.

What waits in the queue is counted per sender and bounded (`inflight`), and so are the large frames a
sender may have decoded in each phase of the run (`budget`); refusals are logged in
bounded size and rate-limited per source (`fedml_moon.status.refusals.RefusalLog`), with a
summary of what was only counted once its window closes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from typing import Any

from fedml.core.distributed.communication.base_com_manager import BaseCommunicationManager
from fedml.core.distributed.communication.message import Message

from fedml_moon.core.codec import CodecError, decode, encode
from fedml_moon.distributed.transport.budget import FrameBudget
from fedml_moon.distributed.transport.inflight import OWN, QUEUED, REFUSED, InFlight, Waiting, coalesced_kind
from fedml_moon.status.refusals import RefusalLog

log = logging.getLogger(__name__)
_STOP = object()
DEFAULT_FRAME_BYTES = 1 << 30


class TransportError(ConnectionError):
    """A peer cannot be reached within the transport's time limit (the message was not delivered)."""


def message_bytes(msg: Message) -> bytes:
    """A FedML Message as codec bytes (its params: type, sender, receiver and payload trees)."""
    return encode(dict(msg.get_params()))


def message_from_bytes(data: bytes) -> Message:
    """The Message in `data`; CodecError when it is not one."""
    params = decode(data)
    if not isinstance(params, dict) or not {"msg_type", "sender", "receiver"} <= set(params):
        raise CodecError("not a message: msg_type, sender and receiver are required")
    sender, receiver = params["sender"], params["receiver"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (sender, receiver)):
        raise CodecError("sender and receiver must be integer ranks")
    msg = Message(params["msg_type"], sender, receiver)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


class QueueTransport(BaseCommunicationManager):
    """Base of the plugin's transports. Receive threads call `deliver(bytes)` (or `admit`); the FedML
    manager's `run()` calls `handle_receive_message()`, which blocks on a queue and hands each message
    to the observers in the calling thread, until `stop_receive_message()`. At most 16 messages and
    `2 x max_frame_bytes + 1 MiB` bytes of one sender wait in the queue; heartbeats and ticks coalesce
    (see `inflight`)."""

    def __init__(
        self, rank: int, max_frame_bytes: int = DEFAULT_FRAME_BYTES, refusals: RefusalLog | None = None
    ) -> None:
        self.rank = int(rank)
        self._observers: list[Any] = []
        self._inbox: queue.Queue = queue.Queue()
        self.inflight = InFlight(max_frame_bytes)
        self.budget = FrameBudget()
        # (rank, "decoded" | "undecoded" | "unread"): its frames decoded, refused before decoding,
        # refused before being read (COUNTED_RANKS ranks at most)
        self.frames: Counter = Counter()
        self.refusals = refusals or RefusalLog(log)
        self._flusher: threading.Timer | None = None
        self._flusher_lock = threading.Lock()
        self.running = True
        self.bytes_sent = 0  # encoded message bytes this process sent / received (the wire payload)
        self.bytes_received = 0
        self.heard: dict[int, float] = {}  # rank -> when a message of it last arrived (receive threads)
        # per rank (COUNTED_RANKS at most): messages of it taken and their bytes; bytes sent to it
        self.messages_from: Counter = Counter()
        self.bytes_from: Counter = Counter()
        self.bytes_to: Counter = Counter()
        self._counts = threading.Lock()  # receive threads count at once

    def add_observer(self, observer: Any) -> None:
        self._observers.append(observer)

    def remove_observer(self, observer: Any) -> None:
        self._observers.remove(observer)

    def send_message(self, msg: Message) -> None:
        data = message_bytes(msg)
        receiver = int(msg.get_receiver_id())
        self.send_bytes(receiver, data)
        self.count_sent(receiver, len(data))

    def count_sent(self, receiver: int, n: int) -> None:
        """Count `n` bytes sent to `receiver` (every transport's sending path calls it)."""
        self.bytes_sent += n
        self._count(self.bytes_to, receiver, n)

    def send_bytes(self, receiver: int, data: bytes) -> None:
        raise NotImplementedError

    def try_send(self, msg: Message, within_s: float) -> bool:
        """Send `msg` if the peer can be reached within about `within_s` (else False, nothing raised):
        for a message said again until it is answered. Here: as `send_message` (a transport whose
        send cannot wait long for its peer, MPI, MQTT's broker)."""
        try:
            self.send_message(msg)
        except TransportError:
            return False
        return True

    def expect(self, owed: dict[int, int]) -> None:
        """A new phase of the run: rank r may send `owed[r]` large frames (and a few more) until the
        next; past them its large frames are refused before they are decoded (`budget`)."""
        self.budget.expect(owed)

    def expect_more(self, rank: int) -> None:
        """`rank` owes one more message in this phase (its work went out again): its allowance grows."""
        self.budget.grant(rank)

    def within_budget(self, sender: int, size: int, source: str) -> bool:
        """Whether a frame of `size` bytes from `sender` fits its phase's allowance; when it does not,
        the refusal is logged (bounded) and counted, the frame not decoded."""
        if self.budget.take(sender, size):
            return True
        self.count_frame(sender, "undecoded")
        what = f"rank {self.rank} refused {self.budget.describe(sender, size)}, from {source}"
        self.refuse(source, what, "frames beyond the phase")
        return False

    def count_frame(self, sender: Any, what: str) -> None:
        """Count a frame of `sender`: "decoded", refused "undecoded" or "unread"."""
        self._count(self.frames, (sender, what), 1)

    def deliver(self, data: bytes, source: str = "a peer") -> str:
        """Decode received bytes and queue the message (QUEUED, COALESCED or REFUSED); malformed
        bytes and a message over its sender's bound are logged (bounded) and dropped."""
        self.bytes_received += len(data)
        try:
            msg = message_from_bytes(data)
        except CodecError as err:
            what = f"rank {self.rank} dropped a malformed message ({len(data)} bytes) from {source}: {err}"
            self.refuse(source, what, "a malformed message")
            return REFUSED
        verdict = self.admit(msg, len(data))
        if verdict == REFUSED:
            self.refuse_busy(source, msg.get_sender_id())
        return verdict

    def admit(self, msg: Message, size: int) -> str:
        """Queue `msg` (`size` bytes on the wire) unless its sender is over its bound (REFUSED, not
        logged here) or one of its kind already waits (COALESCED)."""
        sender, kind = msg.get_sender_id(), coalesced_kind(msg.get_type())
        verdict = self.inflight.admit(sender, kind, size)
        if verdict != REFUSED:
            self.heard_from(sender)
            self._count(self.messages_from, sender, 1)
            self._count(self.bytes_from, sender, size)
        if verdict == QUEUED:
            self._inbox.put(Waiting(msg, sender, kind, size))
        return verdict

    def _count(self, counter: Counter, rank: Any, n: int) -> None:
        with self._counts:
            if rank in counter or len(counter) < COUNTED_RANKS:
                counter[rank] += n

    def heard_from(self, sender: int) -> None:
        """A message of `sender` (the rank the transport authenticated) arrived now: the peer is alive,
        whatever the main thread is busy with (`heard` is what the managers' liveness reads)."""
        self.heard[sender] = time.monotonic()

    def refuse_busy(self, source: str, sender: Any) -> None:
        """Log that a message of `sender` was dropped for its in-flight bound."""
        what = f"rank {self.rank} dropped a message from {source}: {self.inflight.describe(sender)}"
        self.refuse(source, what, "too many messages waiting")

    def post(self, msg: Message) -> None:
        """Queue a message from this process itself (timers, watchdogs) for the main thread; a TICK
        while one is waiting is dropped."""
        kind = coalesced_kind(msg.get_type())
        if self.inflight.admit(OWN, kind, 0, bounded=False) == QUEUED:
            self._inbox.put(Waiting(msg, OWN, kind, 0))

    def handle_receive_message(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _STOP:
                return
            self.inflight.release(item.sender, item.kind, item.size)
            for observer in list(self._observers):
                observer.receive_message(item.msg.get_type(), item.msg)

    def refuse(self, source: str, what: str, reason: str = "") -> None:
        """Log a refusal through `self.refusals` (bounded, rate-limited per `source`); a timer writes
        the summary of what was only counted once the window closes."""
        self.refusals.refused(source, what, reason)
        with self._flusher_lock:
            if self._flusher is None and self.running:
                self._flush_in(self.refusals.window_s)

    def _flush_in(self, seconds: float) -> None:
        """Start the flush timer (with `_flusher_lock` held)."""
        self._flusher = threading.Timer(seconds + 0.05, self._flush)
        self._flusher.daemon = True
        self._flusher.start()

    def _flush(self) -> None:
        # A window that a refusal opened after this timer started is still open: call again when
        # it closes, else its counted refusals would wait for the next refusal to be summarised.
        with self._flusher_lock:
            self._flusher = None
            due = self.refusals.flush()
            if due is not None and self.running:
                self._flush_in(due)

    def stop_receive_message(self) -> None:
        self.running = False
        self._inbox.put(_STOP)
        with self._flusher_lock:
            if self._flusher is not None:
                self._flusher.cancel()
                self._flusher = None
        self.close()

    def close(self) -> None:
        """Release sockets and threads (transport-specific)."""


COUNTED_RANKS = 100_000
"""The ranks a transport keeps message and byte counts of; a sender past them is not counted."""
