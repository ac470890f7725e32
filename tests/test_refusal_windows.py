"""A bounded refusal log accounts for every refusal: what is not logged line by line is counted, and
each window's count is written once that window closes, even when no refusal follows it."""

from __future__ import annotations

import logging
import time

from fedml_moon.distributed.transport.base import QueueTransport
from fedml_moon.status.refusals import RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_a_window_logs_its_budget_and_summarises_the_rest_when_it_closes(caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    log = RefusalLog(logging.getLogger("fedml_moon.test.window"), window_s=10, per_source=2, clock=clock)
    assert [log.refused("10.0.0.1", f"call {i}", reason="no token") for i in range(5)] == [1, 1, 0, 0, 0]
    clock.now = 4.0
    assert log.flush() == 6.0  # three counted, the window closes at 10
    assert len(_lines(caplog, "fedml_moon.test.window")) == 2
    clock.now = 10.0
    assert log.flush() is None
    lines = _lines(caplog, "fedml_moon.test.window")
    assert lines[:2] == ["call 0", "call 1"]
    assert lines[2].startswith("refused 3 more from 10.0.0.1 in the last 10 s")
    assert lines[2].endswith("not logged one by one: no token (x3)")
    assert log.count == 5 and log.by_source == {"10.0.0.1": 5}


def test_the_transports_timer_writes_a_window_that_opened_after_it_started(caplog):
    """The timer a refusal starts fires one window later; when a later refusal opened a new window in
    between, the timer calls again when that window closes, so its count is not held until the next
    refusal (a flood that stops is summarised)."""
    caplog.set_level(logging.INFO)
    clock = Clock()
    log = RefusalLog(logging.getLogger("fedml_moon.test.timer"), window_s=0.2, per_source=1, clock=clock)
    transport = QueueTransport(0, refusals=log)
    try:
        transport.refuse("10.0.0.1", "first")  # logged; its timer fires in 0.25 s
        first = transport._flusher
        clock.now = 0.25  # the first window closed: the next refusal opens a window at 0.25
        transport.refuse("10.0.0.1", "second")  # logged in the new window
        transport.refuse("10.0.0.1", "third", reason="no token")  # counted
        assert first is not None and first.finished.wait(10)
        # the first timer found the window open (no time passed on the log's clock) and called again
        assert _lines(caplog, "fedml_moon.test.timer") == ["first", "second"]
        clock.now = 0.5
        deadline = time.monotonic() + 10  # the timer it started writes the window's summary
        while len(_lines(caplog, "fedml_moon.test.timer")) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _lines(caplog, "fedml_moon.test.timer")[2:] == [
            "refused 1 more from 10.0.0.1 in the last 0 s, not logged one by one: no token (x1)"
        ]
        while transport._flusher is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert transport._flusher is None  # nothing counted is left, no timer is left
    finally:
        transport.stop_receive_message()
