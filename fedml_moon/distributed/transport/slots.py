"""What bounds the gRPC server's threads: per-caller slots, a watchdog that cuts a request that does
not arrive, and the outbox a silo's one Subscribe stream reads.

gRPC's sync server runs each call in a thread of its pool for the call's whole life. A caller (a
rank, or with `auth: none` a host) holds at most `sends` Send calls and `subscribes` Subscribe
streams at once: a Send over its caller's slots is refused, and a newer Subscribe ends the oldest
(a silo that reconnects is never locked out by its own half-dead stream). A call holds its slot
from its start, so the pool sized for every caller's slots plus a margin always has a thread for an
honest silo.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Any

SEND_SLOTS, SUBSCRIBE_SLOTS = 2, 1  # per rank
# calls a caller may start: (per second, in a burst). A silo sends a few messages a round and its
# heartbeats, and subscribes once a session (again after a break, backing off); past the rate a call is
# refused as busy before its request is read, and an honest silo retries after a pause.
CALL_RATES = {"Send": (50.0, 100.0), "Subscribe": (2.0, 20.0)}


def slot_caps(auth: str, workers: int) -> tuple[int, int]:
    """(Send calls, Subscribe streams) one caller may hold: per rank, or per host with `auth: none`."""
    if auth == "none":
        return 2 * workers + 2, workers + 1
    return SEND_SLOTS, SUBSCRIBE_SLOTS


def pool_size(auth: str, workers: int) -> int:
    """Threads for every caller's slots and a margin for calls that are refused at once."""
    sends, subscribes = slot_caps(auth, workers)
    callers = 1 if auth == "none" else workers
    return callers * (sends + subscribes) + max(8, workers)


class Watchdog:
    """Runs a callback once its delay has passed, unless disarmed first; one thread for all calls."""

    def __init__(self, name: str = "grpc-watchdog") -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def arm(self, delay_s: float, callback: Callable[[], None]) -> int:
        """Call `callback` (from the watchdog's thread) in `delay_s` seconds; a handle for `disarm`."""
        with self._cond:
            handle = next(self._ids)
            self._armed[handle] = callback
            heapq.heappush(self._heap, (time.monotonic() + delay_s, handle))
            self._cond.notify()
            return handle

    def disarm(self, handle: int) -> bool:
        """Whether the callback was disarmed before it ran."""
        with self._cond:
            return self._armed.pop(handle, None) is not None

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._armed.clear()
            self._cond.notify()
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                callback = None
                while self._running and callback is None:
                    if self._heap and self._heap[0][1] not in self._armed:
                        heapq.heappop(self._heap)  # disarmed
                        continue
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    if wait is not None and wait <= 0:
                        callback = self._armed.pop(heapq.heappop(self._heap)[1])
                    else:
                        self._cond.wait(wait)
                if not self._running:
                    return
            callback()


class Lease:
    """One call's hold on a slot. `end(why)` cuts the call: while its request is being read it is
    cancelled (the read fails at once), once streaming its wait is woken and it ends itself."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.ended: str | None = None
        self._wake: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def streaming(self, wake: Callable[[], None]) -> bool:
        """The request was read; from now `end` calls `wake`. False when the call was ended already."""
        with self._lock:
            self._wake = wake
            return self.ended is None

    def end(self, why: str, cancel: bool = True) -> None:
        """End the call (once); `cancel=False` when gRPC already ended it (the caller went away)."""
        with self._lock:
            if self.ended is not None:
                return
            self.ended, wake = why, self._wake
        if wake is not None:
            wake()
        elif cancel:
            self.context.cancel()


class Rate:
    """A token bucket per key: `allow(key)` while the key has started fewer than `burst` calls plus
    `per_s` a second since (refill is continuous; bounded state: the idle keys are forgotten)."""

    def __init__(self, per_s: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s, self.burst, self.clock = float(per_s), float(burst), clock
        self._tokens: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, when)
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> bool:
        now = self.clock()
        with self._lock:
            tokens, when = self._tokens.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - when) * self.per_s)
            allowed = tokens >= 1.0
            self._tokens[key] = (tokens - 1.0 if allowed else tokens, now)
            if len(self._tokens) > 4096:  # many hosts (auth: none): forget the full ones
                self._tokens = {k: v for k, v in self._tokens.items() if v[0] < self.burst}
            return allowed


class Slots:
    """Per-key caps on concurrent Send calls and Subscribe streams and on the rate calls start (see
    the module docstring and CALL_RATES)."""

    def __init__(self, sends: int, subscribes: int, rates: dict | None = None) -> None:
        self.caps = {"Send": int(sends), "Subscribe": int(subscribes)}
        self.rates = {m: Rate(*r) for m, r in (rates or CALL_RATES).items()}
        self._lock = threading.Lock()
        self._held: dict[tuple[str, Hashable], list[Lease]] = {}
        self.peak: Counter = Counter()  # (method, key) -> the most calls held at once

    def allow(self, method: str, key: Hashable) -> bool:
        """Whether `key` may start another `method` call now (its rate, CALL_RATES)."""
        return self.rates[method].allow(key)

    def take(self, method: str, key: Hashable, lease: Lease) -> bool:
        """Hold a slot of `method` for `key`. A Send over the cap gets none (False); a Subscribe over
        it ends the oldest stream of `key` and takes its place."""
        ended = None
        with self._lock:
            held = self._held.setdefault((method, key), [])
            if len(held) >= self.caps[method]:
                if method != "Subscribe":
                    return False
                ended = held.pop(0)
            held.append(lease)
            self.peak[(method, key)] = max(self.peak[(method, key)], len(held))
        if ended is not None:
            ended.end("a newer Subscribe of the same caller took its slot")
        return True

    def free(self, method: str, key: Hashable, lease: Lease) -> None:
        with self._lock:
            held = self._held.get((method, key), [])
            if lease in held:
                held.remove(lease)
            if not held:
                self._held.pop((method, key), None)

    def held(self, method: str, key: Hashable) -> int:
        with self._lock:
            return len(self._held.get((method, key), []))


OUTBOX_FRAMES = 64  # frames a silo's outbox keeps while nothing reads it (the oldest go first)


class Outbox:
    """A silo's frames, waiting for its Subscribe stream; one stream reads them at a time (a newer
    `claim` ends the older reader). Bounded, so a silo that never reads (or is gone for hours) costs
    the server at most `max_frames` frames and `max_bytes` bytes: past either bound the oldest frames
    are dropped (a silo that comes back says HELLO and is sent its work again), and a heartbeat is
    not queued while one already waits."""

    def __init__(self, max_frames: int = OUTBOX_FRAMES, max_bytes: int = 1 << 30) -> None:
        self._frames: deque = deque()
        self._cond = threading.Condition()
        self._reader = 0
        self._closed = False
        self.max_frames, self.max_bytes = int(max_frames), int(max_bytes)
        self._bytes, self._beats = 0, 0  # bytes waiting; heartbeats waiting
        self.dropped = 0  # frames dropped as the oldest past the bounds

    def put(self, frame: bytes, heartbeat: bool = False) -> None:
        with self._cond:
            if heartbeat and self._beats:
                return  # one waiting says the same
            self._frames.append((frame, heartbeat))
            self._bytes, self._beats = self._bytes + len(frame), self._beats + heartbeat
            while len(self._frames) > self.max_frames or (
                len(self._frames) > 1 and self._bytes > self.max_bytes
            ):
                self._forget(self._frames.popleft())
                self.dropped += 1
            self._cond.notify_all()

    def _forget(self, item: tuple[bytes, bool]) -> None:
        self._bytes, self._beats = self._bytes - len(item[0]), self._beats - item[1]

    def claim(self) -> int:
        """Become the reader; the previous one's `next` returns None."""
        with self._cond:
            self._reader += 1
            self._cond.notify_all()
            return self._reader

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def replaced(self, reader: int) -> bool:
        """Whether a newer reader claimed the outbox after `reader`."""
        with self._cond:
            return reader != self._reader

    def next(self, reader: int, lease: Lease) -> bytes | None:
        """The next frame for reader `reader`, or None once it must stop: a newer reader, its call
        ended, or the outbox closed and empty (frames put before `close` still go out)."""
        with self._cond:
            while True:
                if reader != self._reader or lease.ended is not None:
                    return None
                if self._frames:
                    item = self._frames.popleft()
                    self._forget(item)
                    return item[0]
                if self._closed:
                    return None
                self._cond.wait()
