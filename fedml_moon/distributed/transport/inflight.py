"""What waits in a transport's inbox for the main thread, counted per sender and bounded.

A sender may have at most `MAX_MESSAGES` (16) messages and `2 x max_frame_bytes + 1 MiB` bytes
waiting; a message past either bound is refused (the transport answers or drops it). A message of a
sender with nothing waiting is always taken (the bytes bound can only be passed by that one message,
which a transport with a frame limit has already checked). A HEARTBEAT from
a sender that already has one waiting, and a TICK while one is waiting, is coalesced: dropped, since
the one waiting says the same. The plugin's protocol is request/response and heartbeats are coalesced,
so an honest peer never comes near these bounds.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

MAX_MESSAGES = 16
SLACK_BYTES = 1 << 20
COALESCED_KINDS = ("heartbeat", "tick")  # protocol.HEARTBEAT, protocol.TICK
QUEUED, COALESCED, REFUSED = "queued", "coalesced", "refused"
OWN = "own"  # the sender key of what a process posts to itself (ranks are ints)


def coalesced_kind(msg_type: Any) -> str | None:
    """`msg_type` when it is a kind that coalesces (a frame's msg_type may be any JSON value)."""
    return msg_type if isinstance(msg_type, str) and msg_type in COALESCED_KINDS else None


def bytes_bound(max_frame_bytes: int) -> int:
    """The most bytes one sender may have waiting: two frames of the largest size and 1 MiB."""
    return 2 * int(max_frame_bytes) + SLACK_BYTES


@dataclass
class Waiting:
    """An inbox entry: the message, and what it counts for against its sender."""

    msg: Any
    sender: Hashable
    kind: str | None
    size: int


class InFlight:
    """Per-sender counts and bytes of the messages waiting; thread-safe (receive threads admit, the
    main thread releases)."""

    def __init__(self, max_frame_bytes: int, max_messages: int = MAX_MESSAGES) -> None:
        self.max_messages, self.max_bytes = int(max_messages), bytes_bound(max_frame_bytes)
        self._lock = threading.Lock()
        self._count: Counter = Counter()
        self._bytes: Counter = Counter()
        self._kinds: Counter = Counter()  # (sender, coalescing kind) -> waiting

    def admit(self, sender: Hashable, kind: str | None, size: int, bounded: bool = True) -> str:
        """QUEUED (now counted), COALESCED (one of its kind already waits) or REFUSED (over a bound;
        `bounded=False` for a process's own messages)."""
        with self._lock:
            if kind is not None and self._kinds[(sender, kind)] > 0:
                return COALESCED
            if bounded and not self._fits(sender, size):
                return REFUSED
            self._count[sender] += 1
            self._bytes[sender] += size
            if kind is not None:
                self._kinds[(sender, kind)] += 1
            return QUEUED

    def room(self, sender: Hashable, size: int = 0) -> bool:
        """Whether a message of `size` bytes from `sender` would pass the bounds now (`size` 0: whether
        any message would, to refuse one before reading it)."""
        with self._lock:
            return self._fits(sender, size)

    def _fits(self, sender: Hashable, size: int) -> bool:
        """The bounds `admit` and `room` apply (the caller holds the lock)."""
        count = self._count[sender]
        return count < self.max_messages and (count == 0 or self._bytes[sender] + size <= self.max_bytes)

    def grow(self, sender: Hashable, extra: int) -> bool:
        """Count `extra` more bytes for a message of `sender` already admitted (its size became known
        later); False, counting nothing, when that would pass the bound."""
        with self._lock:
            if self._bytes[sender] + extra > self.max_bytes:
                return False
            self._bytes[sender] += extra
            return True

    def release(self, sender: Hashable, kind: str | None, size: int) -> None:
        """A message admitted as (`sender`, `kind`, `size`) no longer waits."""
        with self._lock:
            for counter, key, n in (
                (self._count, sender, 1),
                (self._bytes, sender, size),
                (self._kinds, (sender, kind), 1 if kind is not None else 0),
            ):
                counter[key] -= n
                if counter[key] <= 0:
                    del counter[key]

    def waiting(self, sender: Hashable) -> tuple[int, int]:
        """(messages, bytes) of `sender` waiting now."""
        with self._lock:
            return self._count.get(sender, 0), self._bytes.get(sender, 0)

    def describe(self, sender: Hashable) -> str:
        """Why a message of `sender` is refused, with the bounds."""
        count, size = self.waiting(sender)
        return (
            f"{count} messages ({size} bytes) of it already wait to be handled "
            f"(at most {self.max_messages} messages and {self.max_bytes} bytes)"
        )
