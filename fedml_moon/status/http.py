"""The status port: a run's status served by its server (`tracking_args.status_port`, off by default)
as a page (`/`), JSON (`/status.json`) and Prometheus metrics (`/metrics`).

Who sees what: every request needs credentials, HTTP Basic over the run's TLS: `operator` with the
operator's token, or `silo-<r>` with site r's token (the tokens `fedml-moon certs` writes; the server
holds their SHA-256 digests in server-tokens.json). Without them a client gets 401 and nothing else.
The operator sees every site and the metrics; a site sees what the run tells every site (round,
phase, the global test figures and curves, the pace) and its own entry among the sites, the others'
only where `tracking_args.status_sites_visible` says so; `/metrics` is the operator's (403).

Off the training path: the port runs in threads of its own and reads the run's files (status.json,
metrics.jsonl, summary.json: what `fedml-moon status` reads), at most twice a second whatever the
number of readers; it never touches the server's objects. Each user from each client address (and
all requests without valid credentials from an address together) may make RATE requests in
RATE_WINDOW_S (then 429), at most MAX_OPEN requests are served at once (another is closed
unanswered), only GET and HEAD are answered, a request with a body is refused (413), and a client that
stalls is dropped after TIMEOUT_S: no reader can slow a round, and a killed one leaves nothing behind."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import ssl
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fedml_moon.run_folder import read_records
from fedml_moon.security import OPERATOR, check_token, rank_of_common_name, token_digest
from fedml_moon.status import record as run_status

log = logging.getLogger(__name__)

RATE, RATE_WINDOW_S = 60, 10.0
MAX_OPEN = 8
TIMEOUT_S = 5.0
FRESH_S = 0.5  # the status is read from the files at most this often
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
}


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
        if user == self.owner or self.sites_visible:
            return status, records
        rank = rank_of_common_name(user)
        mine = [s for s in status.get("sites", []) if s.get("rank") == rank]
        fields = ("round", "test_acc", "test_loss", "round_time_s", "parties")
        shared = [{k: r[k] for k in fields if k in r} for r in records]
        return {**status, "sites": mine}, shared

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


class _Handler(BaseHTTPRequestHandler):
    server_version = "fedml-moon"
    sys_version = ""
    timeout = TIMEOUT_S

    def setup(self) -> None:
        super().setup()  # the socket's timeout set: a TLS handshake that stalls is dropped too
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ssl.SSLError) as err:  # a client that stalls, or speaks no TLS
            log.debug("status port: %s dropped: %s", self.client_address[0], err)

    def _send(
        self, code: int, kind: str = "text/plain", body: bytes = b"", extra: dict | None = None
    ) -> None:
        self.send_response(code)
        for key, value in {**SECURITY_HEADERS, **(extra or {}), "Content-Type": kind}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        app: StatusApp = self.server.app  # type: ignore[attr-defined]
        user = app.viewer(self.headers.get("Authorization"))
        if not app.allowed(f"{self.client_address[0]} {user}"):  # each user its own; no user: one
            return self._send(429, extra={"Retry-After": str(int(RATE_WINDOW_S))})
        if int(self.headers.get("Content-Length") or 0) > 0:
            return self._send(413)
        if user is None:
            return self._send(401, extra={"WWW-Authenticate": 'Basic realm="fedml-moon status"'})
        self._send(*app.answer(self.path, user))

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(405, extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("status port: %s %s", self.client_address[0], fmt % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = MAX_OPEN

    def __init__(self, address: tuple[str, int], app: StatusApp) -> None:
        super().__init__(address, _Handler)
        self.app = app
        self.open = threading.BoundedSemaphore(MAX_OPEN)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.open.acquire(blocking=False):  # too many at once: closed at once, unanswered
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.open.release()


class StatusPort:
    """The port, serving `app` on `host:port` (0: a free port) in threads of its own; TLS with `tls`
    (the server's certificate and key)."""

    def __init__(self, app: StatusApp, host: str, port: int, tls: tuple[str, str] | None = None) -> None:
        self.server = _Server((host, port), app)
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(  # each handshake on the request's own thread
                self.server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self.host, self.port = host, self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="status-port", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/"

    def start(self) -> StatusPort:
        self._thread.start()
        log.info("status port: %s (/, /status.json, /metrics; HTTP Basic: operator or silo-<r>)", self.url)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _serve(app: StatusApp, cfg: Any, key: str, port: int) -> StatusPort:
    """The port for `app` on tracking_args.status_host: TLS with this process's certificate if it has
    one; without, loopback only."""
    from fedml_moon.config.schema import ConfigError
    from fedml_moon.security import is_loopback

    t, c = cfg.tracking_args, cfg.comm_args
    tls = (c.tls_cert, c.tls_key) if c.tls_cert and c.tls_key else None
    if tls is None and not is_loopback(t.status_host):
        raise ConfigError(
            f"tracking_args.status_host: {t.status_host} is not a loopback address, and this process has "
            "no TLS certificate (comm_args.tls_cert, tls_key) to serve it with; use 127.0.0.1, or give them"
        )
    try:
        return StatusPort(app, t.status_host, port, tls).start()
    except OSError as err:
        raise ConfigError(
            f"tracking_args.{key}: cannot listen on {t.status_host}:{port} ({err}); choose a free port, or 0"
        ) from None


def open_site_port(cfg: Any, folder: Path, rank: int) -> StatusPort | None:
    """A silo's own status port (`tracking_args.site_status_port`) on its folder, read with its token
    (user `silo-<rank>`: it sees all of its folder's status and its metrics); None when off."""
    from fedml_moon.config.schema import ConfigError

    t = cfg.tracking_args
    if t.site_status_port is None:
        return None
    token = t.site_status_token or cfg.comm_args.token_path
    if not token or not Path(token).is_file():
        raise ConfigError(
            f"tracking_args.site_status_token: a silo's status port needs its token ({token} is not a "
            "file): give its silo-<r>.token"
        )
    user = f"silo-{rank}"
    app = StatusApp(folder, {user: token_digest(Path(token).read_text().strip())}, owner=user)
    return _serve(app, cfg, "site_status_port", t.site_status_port)


def open_port(cfg: Any, out_dir: Path) -> StatusPort | None:
    """The status port of the run's server as its config says (`tracking_args.status_*`), started;
    None when it is off. Refuses (ConfigError) a port without credentials, or on an address that is
    not loopback without the run's TLS."""
    from fedml_moon.config.schema import ConfigError

    t, c = cfg.tracking_args, cfg.comm_args
    if t.status_port is None:
        return None
    tokens = t.status_tokens or c.token_path
    if not tokens or not Path(tokens).is_file():
        raise ConfigError(
            f"tracking_args.status_tokens: the status port needs the tokens that may read it ({tokens} is "
            "not a file): give server-tokens.json as `fedml-moon certs` writes it"
        )
    app = StatusApp(out_dir, load_viewers(Path(tokens)), t.status_sites_visible)
    return _serve(app, cfg, "status_port", t.status_port)
