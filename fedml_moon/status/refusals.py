"""Refusals in the log, bounded: what a peer sends is never logged at its own size, and a peer that is
refused again and again is counted, not logged line by line.

Each source (a silo's rank, a peer address) gets at most `per_source` full lines per window of
`window_s` seconds and the whole log at most `total`; each line holds at most `width` characters of
what was refused. Past those budgets a refusal is counted, and once its window has closed a summary
line says how many were not logged one by one and why (the three most frequent reasons). What is
counted is bounded too: at most `HELD_SOURCES` sources and `HELD_REASONS` reasons per source a
window, the rest under "other sources" / "other reasons", so a flood from many addresses gives a
bounded number of summary lines. Thread-safe: transports refuse from their receive threads, the
managers from their main thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

WIDTH = 300
HELD_SOURCES = 20
HELD_REASONS = 10
COUNTED_SOURCES = 1000
COUNTED_REASONS = 50
UNNAMED_REASON = "refused by the protocol"  # a refusal logged without a short reason of its own
OTHER_SOURCES, OTHER_REASONS = "other sources", "other reasons"


def bounded(value: object, width: int = WIDTH) -> str:
    """`str(value)` cut to at most `width` characters (with how much was cut)."""
    text = str(value)
    if len(text) <= width:
        return text
    return f"{text[:width]}... ({len(text) - width} more characters)"


class RefusalLog:
    """`refused(source, what)` logs `what` (bounded) or counts it; see the module docstring."""

    def __init__(
        self,
        logger: logging.Logger,
        window_s: float = 10.0,
        per_source: int = 20,
        total: int = 100,
        width: int = WIDTH,
        clock: Callable[[], float] = time.monotonic,
        verb: str = "refused",
    ) -> None:
        self.logger, self.window_s, self.width, self.clock = logger, window_s, width, clock
        self.verb = verb  # the summary's word for what it counted (a log of notices: "noted")
        self.per_source, self.total = per_source, total
        self._lock = threading.Lock()
        self._start = clock()
        self._lines: Counter = Counter()  # source -> full lines in this window
        self._held: dict[str, Counter] = {}  # source -> reason -> refusals counted, not logged
        self.count = 0  # every refusal so far, logged or counted
        self.by_source: Counter = Counter()  # every refusal so far by source (COUNTED_SOURCES at most)
        self.by_reason: Counter = Counter()  # ... and by its reason (COUNTED_REASONS at most)

    def refused(
        self, source: str, what: str, reason: str = "", level: int = logging.WARNING, counted: bool = True
    ) -> bool:
        """One refusal from `source`: `what` in full (cut to `width`) while the budgets last, else
        counted under `reason` (default: `what`'s first 60 characters) for the window's summary.
        Whether it was logged in full (an answer to the peer can be bounded by the same budget).
        `counted`: whether `by_source` counts it (a peer's BYE or ERROR is logged this way, bounded,
        but is no refusal of its message)."""
        with self._lock:
            self.count += 1
            if counted:
                known = source in self.by_source or len(self.by_source) < COUNTED_SOURCES
                self.by_source[source if known else OTHER_SOURCES] += 1
                why = bounded(reason, 60) if reason else UNNAMED_REASON
                known = why in self.by_reason or len(self.by_reason) < COUNTED_REASONS
                self.by_reason[why if known else OTHER_REASONS] += 1
            self._roll()
            if self._lines[source] < self.per_source and sum(self._lines.values()) < self.total:
                self._lines[source] += 1
                self.logger.log(level, "%s", bounded(what, self.width))
                return True
            key = bounded(reason or what, 60) if (reason or what) else "?"
            if source not in self._held and len(self._held) >= HELD_SOURCES:
                source = OTHER_SOURCES
            reasons = self._held.setdefault(source, Counter())
            if key not in reasons and len(reasons) >= HELD_REASONS:
                key = OTHER_REASONS
            reasons[key] += 1
            return False

    def flush(self) -> float | None:
        """Write the summaries of a window that has closed (call it from a timer; `refused` does too).
        Returns the seconds until the current window closes while it holds counted refusals (when
        the timer must call again), else None."""
        with self._lock:
            self._roll()
            if not self._held:
                return None
            return max(0.0, self._start + self.window_s - self.clock())

    def _roll(self) -> None:
        now = self.clock()
        if now - self._start < self.window_s:
            return
        for source, reasons in sorted(self._held.items()):
            top = "; ".join(f"{reason} (x{n})" for reason, n in reasons.most_common(3))
            self.logger.warning(
                "%s %d more from %s in the last %.0f s, not logged one by one: %s",
                self.verb,
                sum(reasons.values()),
                bounded(source, 80),
                now - self._start,
                top,
            )
        self._start, self._lines, self._held = now, Counter(), {}
