"""What the status port answers (`fedml_moon.status.http` serves it): who a request's credentials
prove, how many requests a client may make, what each user sees of the run, and which addresses gave
valid credentials lately (they may take the port's reserved slots)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from fedml_moon.run_folder import read_records
from fedml_moon.security import OPERATOR, check_token, rank_of_common_name
from fedml_moon.status import record as run_status
from fedml_moon.status.refusals import RefusalLog

log = logging.getLogger("fedml_moon.status.http")

RATE, RATE_WINDOW_S = 60, 10.0
KNOWN_S = 600.0  # an address that gave valid credentials may take a reserved slot this long
FRESH_S = 0.5  # the status is read from the files at most this often
SHARED = ("round", "test_acc", "test_loss", "round_time_s", "parties", *run_status.EPSILONS)  # a site sees
LINE = ("rank", "connected", "heard_at", "last_heard_s", "rounds", "refused")  # another site's, if visible


def load_viewers(path: Path) -> dict[str, str]:
    """Who may read the status: user name (`operator`, `silo-<r>`) -> the SHA-256 hex digest of its
    token, from server-tokens.json (a rank's entry: its digest or {"sha256": ...})."""
    raw = json.loads(Path(path).read_text())
    out = {}
    for key, value in raw.items():
        digest = str(value["sha256"] if isinstance(value, dict) else value)
        out[OPERATOR if key == OPERATOR else f"silo-{key}"] = digest
    return out


class StatusApp:
    """What the port answers, for the run in `out_dir`."""

    def __init__(
        self,
        out_dir: Path,
        viewers: dict[str, str],
        sites_visible: bool = False,
        rate: int = RATE,
        owner: str = OPERATOR,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.rate, self.owner = rate, owner  # owner: who sees all and the metrics
        self.viewers = viewers
        self.sites_visible = sites_visible
        self._lock = threading.Lock()
        self._read_at = -1e9
        self._snapshot: tuple[dict[str, Any], list[dict[str, Any]]] = ({}, [])
        self._seen: dict[str, deque] = {}
        self._known: dict[str, float] = {}  # client address -> when it last gave valid credentials
        self.refusals = RefusalLog(log, verb="refused")

    def vouch(self, address: str) -> None:
        """`address` gave valid credentials: it may take a reserved slot for KNOWN_S."""
        with self._lock:
            self._known[address] = time.monotonic()
            if len(self._known) > 10_000:  # forget the stale ones
                now = time.monotonic()
                self._known = {a: at for a, at in self._known.items() if now - at <= KNOWN_S}

    def known(self, address: str) -> bool:
        """Whether `address` gave valid credentials within KNOWN_S."""
        with self._lock:
            at = self._known.get(address)
            return at is not None and time.monotonic() - at <= KNOWN_S

    def viewer(self, header: str | None) -> str | None:
        """The user an `Authorization: Basic ...` header proves, or None."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, token = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return user if check_token(self.viewers, user, token) else None

    def allowed(self, client: str) -> bool:
        """Whether `client` is within `rate` requests in the last RATE_WINDOW_S (this one counted)."""
        now = time.monotonic()
        with self._lock:
            seen = self._seen.setdefault(client, deque())
            while seen and now - seen[0] > RATE_WINDOW_S:
                seen.popleft()
            if len(seen) >= self.rate:
                return False
            seen.append(now)
            if len(self._seen) > 10_000:  # forget idle clients
                self._seen = {c: q for c, q in self._seen.items() if q and now - q[-1] <= RATE_WINDOW_S}
            return True

    def snapshot(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The run's status and records, read again when older than FRESH_S."""
        with self._lock:
            if time.monotonic() - self._read_at >= FRESH_S:
                try:
                    rows = read_records(self.out_dir)  # metrics.jsonl read once for both
                    self._snapshot = (run_status.read(self.out_dir, rows), rows)
                except FileNotFoundError:  # the server has written nothing yet
                    self._snapshot = (run_status.starting(self.out_dir), [])
                self._read_at = time.monotonic()
            return self._snapshot

    def view(self, user: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The status and records as `user` may see them (module docstring)."""
        status, records = self.snapshot()
        if user == self.owner:
            return status, records
        rank = rank_of_common_name(user)
        sites = [
            s if s.get("rank") == rank else {k: s[k] for k in LINE if k in s}
            for s in status.get("sites", [])
            if s.get("rank") == rank or self.sites_visible
        ]
        shared = [{k: r[k] for k in SHARED if k in r} for r in records]
        view = {k: v for k, v in status.items() if k != "refused"}  # the server's refusals: the operator's
        return {**view, "sites": sites}, shared

    def answer(self, path: str, user: str) -> tuple[int, str, bytes]:
        """(HTTP status, content type, body) for GET `path` by `user`."""
        from fedml_moon.status.page import render_html

        status, records = self.view(user)
        route = path.split("?", 1)[0]
        if route == "/":
            return 200, "text/html; charset=utf-8", render_html(status, records).encode()
        if route == "/status.json":
            return 200, "application/json", json.dumps(status, allow_nan=False, default=str).encode()
        if route == "/metrics":
            if user != self.owner:
                return 403, "text/plain", f"the metrics are {self.owner}'s\n".encode()
            from prometheus_client import CONTENT_TYPE_LATEST

            from fedml_moon.status.metrics import exposition

            return 200, CONTENT_TYPE_LATEST, exposition(status, records)
        return 404, "text/plain", b"not found: /, /status.json or /metrics\n"
