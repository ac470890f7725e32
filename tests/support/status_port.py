"""A status port in the test's own process (a real HTTP server on 127.0.0.1, threads of this process)
on a run folder the way a distributed run's server writes it, and a client of it."""

from __future__ import annotations

import base64
import http.client
import ssl
import time
from pathlib import Path

from fedml_moon.records.recorder import RunRecorder
from fedml_moon.status.app import StatusApp, load_viewers
from fedml_moon.status.http import StatusPort

SITES = [
    {"rank": 1, "connected": True, "heard_at": 0.0, "rounds": 3, "refused": 0, "messages": 40,
     "bytes_received": 9000, "bytes_sent": 8000},
    {"rank": 2, "connected": False, "heard_at": -40.0, "rounds": 1, "refused": 7, "messages": 12,
     "bytes_received": 3000, "bytes_sent": 2500},
]  # heard_at: seconds from the moment the run is written  # fmt: skip


def write_run(folder: Path) -> Path:
    """A run folder in round 3 of 10, as a distributed run's server writes it."""
    recorder = RunRecorder(folder, {"train_args": {"algorithm": "moon", "comm_round": 10}})
    for r in range(3):
        recorder.log_round(
            {"round": r, "parties": 2, "test_acc": 0.5 + r / 10, "test_loss": 1.0 - r / 10,
             "round_time_s": 2.0, "party_test": {"0": 0.9, "1": 0.1}, "wire_bytes_sent": 100,
             "wire_bytes_received": 50,
             **({"missing_parties": [1]} if r == 1 else {})}
        )  # fmt: skip
    now = time.time()
    sites = [{**s, "heard_at": now + s["heard_at"]} for s in SITES]
    recorder.publish(round=3, phase="training", sites=sites, refused={"a malformed message": 2, "too big": 5})
    return folder


def token_of(certs: Path, who: str) -> str:
    """The token `fedml-moon certs` wrote for `who` (operator, silo-<r>)."""
    return (certs / f"{who}.token").read_text()


class Client:
    """Requests to a port, each on a connection of its own."""

    def __init__(self, port: StatusPort, context: ssl.SSLContext | None = None) -> None:
        self.port, self.context = port, context

    def get(self, path: str, who: str | None = None, token: str | None = None, method="GET", body=None):
        if self.context is not None:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port.port, timeout=10, context=self.context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port.port, timeout=10)
        headers = {}
        if who is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{who}:{token}".encode()).decode()
        try:
            conn.request(method, path, body=body, headers=headers)
            reply = conn.getresponse()
            return reply.status, dict(reply.getheaders()), reply.read()
        finally:
            conn.close()


def serve(run: Path, certs: Path, rate: int) -> Client:
    """A port on `run` that the tokens of `certs` may read, `rate` requests a window per client."""
    port = StatusPort(StatusApp(run, load_viewers(certs / "server-tokens.json"), rate=rate), "127.0.0.1", 0)
    return Client(port.start())
