"""What each sender may send the server in the current phase of the run, checked by a frame's size
before it is decoded.

The server's manager says at each phase which ranks owe it a message (`expect`): in a round's train
phase each rank it sent work to owes its RESULT, in the eval phase its REPORT, in the hello phase its
HELLO and READY; work sent again to a restarted silo adds one (`grant`). A frame over
`SMALL_FRAME_BYTES` (an upload, a report, a claim of many parties) is taken only while its sender has
some of its phase's allowance left: what it owes and `SPARE_FRAMES` more, twice as many as may wait at
once, for this phase's work and the late answers to the phase before's (a restarted silo's HELLO and
READY; and a silo whose own messages the server refused, as tests/test_hostile_silo.py's ten large
ones for each TRAIN, twenty in a phase where it answers a TRAIN late, still has its honest one
taken); past that it is refused before it is decoded, and counted, until the next phase. Small frames
(heartbeats, BYE, ERROR, CHECKPOINTED) are bounded by the call rates and the in-flight bound only.
So a sender that floods large frames gets at most its allowance of them decoded per phase, however
long the flood lasts. Until the first `expect` (a silo's transport, which takes only the server's
frames) every frame passes.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Mapping

from fedml_moon.distributed.transport.inflight import MAX_MESSAGES

SMALL_FRAME_BYTES = 256 << 10
SPARE_FRAMES = 2 * MAX_MESSAGES


class FrameBudget:
    """Per sender, the frames over `small_bytes` it may still send in this phase; thread-safe (the
    receive threads take, the main thread opens phases)."""

    def __init__(self, small_bytes: int = SMALL_FRAME_BYTES, spare: int = SPARE_FRAMES) -> None:
        self.small_bytes, self.spare = int(small_bytes), int(spare)
        self._owed: dict[Hashable, int] | None = None  # None: no phase declared, every frame passes
        self._used: Counter = Counter()
        self._lock = threading.Lock()

    def expect(self, owed: Mapping[Hashable, int]) -> None:
        """A new phase: each sender may send `owed[sender]` (0 when absent) + `spare` large frames
        until the next call."""
        with self._lock:
            self._owed, self._used = {k: int(v) for k, v in owed.items()}, Counter()

    def grant(self, sender: Hashable) -> None:
        """`sender` owes one more message in this phase (its work was sent again): one more large
        frame and `spare` more."""
        with self._lock:
            if self._owed is not None:
                self._owed[sender] = self._owed.get(sender, 0) + 1 + self.spare

    def take(self, sender: Hashable, size: int) -> bool:
        """Count a frame of `size` bytes from `sender` against its allowance; False (counting
        nothing) when it is large and the allowance is spent."""
        if size <= self.small_bytes:
            return True
        with self._lock:
            if self._owed is None:
                return True
            if self._used[sender] >= self._owed.get(sender, 0) + self.spare:
                return False
            self._used[sender] += 1
            return True

    def describe(self, sender: Hashable, size: int) -> str:
        """Why a frame of `sender` of `size` bytes is refused, with the allowance."""
        with self._lock:
            allowed = (self._owed or {}).get(sender, 0) + self.spare
        return (
            f"a frame of {size} bytes: it already sent the {allowed} frames over {self.small_bytes} bytes "
            "that the server's current phase takes from it (what it owes and "
            f"{self.spare} more); sent again, it is taken in a later phase"
        )
