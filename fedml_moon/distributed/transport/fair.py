"""A fair share of the gRPC server's decoding per rank: what one rank's frames can cost the others'.

Decoding a frame is Python work under the GIL: a frame of many small values takes tens of ms per
MB, and frames decoded side by side only share the one interpreter (and slow the main thread, which
waits for the GIL behind each of them). `FairTurns` decodes one frame at a time, and when frames of
several ranks wait, the turn goes to the rank that has had the least decoding time in this phase of
the run. So while n ranks have frames waiting, each gets at least 1/n of the decoding; a rank that
floods gets more only while no other rank has a frame waiting; an honest rank's frame (which has
had less than the flooder) waits for at most the one decode in progress, then is decoded alone, and
the main thread shares the GIL with at most one decoding thread. Waiting costs no thread beyond the
rank's Send slots (2), and each rank's time is counted from zero again at each phase (`reset`).

And a rank's decoding is bounded in time, whoever else waits: each rank may run up to `BURST_S`
seconds of decoding ahead of `RATE` seconds a second (a token bucket of decoding time); past it its
frames are refused before they are decoded (gRPC: RESOURCE_EXHAUSTED as busy, which a silo retries),
so one rank's frames cost the server at most `RATE` of a core, plus `BURST_S` and one frame, however
long its flood lasts. An honest silo's frames (tensors, a few a round) take milliseconds to decode.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

RATE = 0.1  # seconds of decoding a second one rank's frames may use, past its burst
BURST_S = 1.0
KEPT_KEYS = 4096  # ranks (or, with auth "none", hosts) whose decoding time is kept in a phase


class FairTurns:
    """One decode at a time, least-served waiting rank first (see the module docstring).

    Counters, per key: `turns` (frames decoded), `used` (their decoding seconds, this phase), and
    `behind` (the most decodes of other frames that started while one of its frames waited)."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, rate: float = RATE, burst_s: float = BURST_S
    ) -> None:
        self.clock, self.rate, self.burst_s = clock, float(rate), float(burst_s)
        self._debt: dict[Hashable, tuple[float, float]] = {}  # key -> (decoding seconds owed, when)
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: Counter = Counter()  # key -> its frames waiting for a turn
        self._started = 0  # decodes started so far
        self.used: Counter = Counter()
        self.turns: Counter = Counter()
        self.behind: Counter = Counter()

    @contextmanager
    def turn(self, key: Hashable) -> Iterator[None]:
        """Wait for `key`'s turn, then hold it (decode) until the block ends."""
        with self._cond:
            mark = self._started
            self._waiting[key] += 1
            try:
                while self._busy or self._next() != key:
                    self._cond.wait()
            finally:
                self._waiting[key] -= 1
                if self._waiting[key] <= 0:
                    del self._waiting[key]
            self._busy, self._started = True, self._started + 1
            self.behind[key] = max(self.behind[key], self._started - 1 - mark)
            self.turns[key] += 1
        began = self.clock()
        try:
            yield
        finally:
            with self._cond:
                took, now = self.clock() - began, self.clock()
                self.used[key] += took
                self._debt[key] = (self._owed(key, now) + took, now)
                if len(self.used) > KEPT_KEYS:  # many hosts (auth "none"): the rest count from zero
                    self.used = Counter(dict(self.used.most_common(KEPT_KEYS)))
                    self._debt = {k: self._debt[k] for k in self.used if k in self._debt}
                self._busy = False
                self._cond.notify_all()

    def _owed(self, key: Hashable, now: float) -> float:
        """`key`'s decoding seconds not yet paid back at `RATE` (the caller holds the lock)."""
        debt, when = self._debt.get(key, (0.0, now))
        return max(0.0, debt - (now - when) * self.rate)

    def within(self, key: Hashable) -> bool:
        """Whether `key` may have another frame decoded now (its decoding within `BURST_S`)."""
        with self._cond:
            return self._owed(key, self.clock()) < self.burst_s

    def describe(self, key: Hashable) -> str:
        """Why a frame of `key` is refused undecoded, with the bound."""
        return (
            f"its frames already took {self.burst_s:g} s of decoding more than {self.rate:g} s a second; "
            "sent again, it is taken once the server has paid that back"
        )

    def _next(self) -> Hashable:
        """The waiting key with the least decoding time this phase (the earliest to wait on a tie)."""
        return min(self._waiting, key=lambda k: self.used.get(k, 0.0))

    def reset(self) -> None:
        """A new phase: every rank's decoding time counts from zero."""
        with self._cond:
            self.used = Counter()
