"""The status port against clients without credentials that send well-formed hostile requests: heads
sent a byte at a time from many addresses (slowloris), lengths that are not counts, bodies on a GET.
The invariants: the operator is answered throughout, each slow head is dropped at its deadline, a
refused request is answered 400 or 413 and costs the log one bounded line (never a traceback), and
the port serves on. A real HTTP server on 127.0.0.1 (threads of this process); its clients come from
other loopback addresses (127.0.0.2 and up) as remote ones would."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from fedml_moon.security import make_certs
from fedml_moon.status import http as status_http
from tests.support.status_port import serve, token_of, write_run

ATTACKERS = [f"127.0.0.{i}" for i in range(2, 10)]  # eight addresses: as many as the port has slots


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder, 2, ["127.0.0.1"])
    return folder


@pytest.fixture
def served(tmp_path, certs):
    client = serve(write_run(tmp_path / "run"), certs, 1000)
    yield client
    client.port.stop()


def _raw(port: int, source: str, data: bytes) -> bytes:
    """Send `data` from `source` and read the whole reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _slowloris(port: int, source: str, stop: threading.Event, closed: list[float]) -> None:
    """One connection that sends its head a byte every 0.5 s, again and again while it lasts; the
    time each connection lasted is kept."""
    head = b"GET /status.json HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    while not stop.is_set():
        opened = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
                for byte in head:
                    if stop.is_set():
                        return
                    s.sendall(bytes([byte]))
                    time.sleep(0.5)
        except OSError:  # dropped by the port
            closed.append(time.monotonic() - opened)


def test_slow_heads_from_many_addresses_keep_the_operator_from_nothing(served, certs):
    """Eight clients each holding connections that send a byte every half second: the operator
    (whose address gave its credentials before) gets every answer, and each slow connection is
    dropped at the head's deadline."""
    token = token_of(certs, "operator")
    assert served.get("/status.json", "operator", token)[0] == 200
    stop, closed = threading.Event(), []
    flood = [
        threading.Thread(target=_slowloris, args=(served.port.port, a, stop, closed), daemon=True)
        for a in ATTACKERS
    ]
    for t in flood:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while served.port.server.open < status_http.MAX_OPEN - status_http.RESERVED:  # the flood is in
            assert time.monotonic() < deadline
            time.sleep(0.05)
        answered = [served.get("/status.json", "operator", token)[0] for _ in range(20)]
        deadline = time.monotonic() + 3 * status_http.HEAD_DEADLINE_S
        while len(closed) < len(ATTACKERS):  # each slow connection dropped at least once
            assert time.monotonic() < deadline, closed
            time.sleep(0.1)
    finally:
        stop.set()
        for t in flood:
            t.join(timeout=30)
    assert answered == [200] * 20
    assert all(lasted <= status_http.HEAD_DEADLINE_S + 2 for lasted in closed), closed


def test_strangers_cannot_take_the_reserved_slots(served):
    """Connections from addresses that never gave credentials hold at most MAX_OPEN - RESERVED."""
    idle = []
    try:
        for a in ATTACKERS:
            for _ in range(2):
                idle.append(socket.create_connection(("127.0.0.1", served.port.port), source_address=(a, 0)))
        deadline = time.monotonic() + 30
        while served.port.server.open < status_http.MAX_OPEN - status_http.RESERVED:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)  # the rest were closed unanswered, not queued: the count stays
        assert served.port.server.open == status_http.MAX_OPEN - status_http.RESERVED
    finally:
        for s in idle:
            s.close()


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        (b"Content-Length: abc\r\n", b"400"),
        (b"Content-Length: -5\r\n", b"400"),
        (b"Content-Length: 1e3\r\n", b"400"),
        (b"Content-Length: 99999999999999999999999\r\n", b"400"),
        (b"Transfer-Encoding: chunked\r\n", b"413"),
        (b"Content-Length: 4\r\n", b"413"),
    ],
)
def test_a_length_that_is_no_count_or_a_body_is_refused_and_serving_goes_on(served, certs, headers, code):
    request = b"GET /status.json HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    reply = _raw(
        served.port.port,
        ATTACKERS[0],
        request + (b"4\r\nabcd\r\n0\r\n\r\n" if b"chunked" in headers else b""),
    )
    assert reply.split(b"\r\n", 1)[0].split(b" ")[1] == code, reply[:200]
    assert b"phase" not in reply and b"round" not in reply  # nothing of the run
    assert served.get("/status.json", "operator", token_of(certs, "operator"))[0] == 200


def test_a_flood_of_bad_lengths_costs_the_log_bounded_lines_and_no_traceback(served, caplog):
    """480 requests with `Content-Length: abc` from eight addresses: each answered 400, the log holds
    at most the refusal log's lines a window (its budget per source and in all), never a traceback."""
    caplog.set_level(logging.DEBUG, logger="fedml_moon.status")
    request = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"
    codes = [_raw(served.port.port, ATTACKERS[i % 8], request).split(b" ")[1] for i in range(480)]
    assert codes == [b"400"] * 480
    logged = [
        r for r in caplog.records if r.name.startswith("fedml_moon.status") and r.levelno >= logging.INFO
    ]
    app = served.port.server.app
    assert len(logged) <= app.refusals.total and all(r.exc_info is None for r in logged)
    assert "Traceback" not in caplog.text and all(len(r.getMessage()) <= 400 for r in logged)
    assert app.refusals.count == 480
