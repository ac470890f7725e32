"""The status port: a run's status served by its server (`tracking_args.status_port`, off by default)
as a page (`/`), JSON (`/status.json`) and Prometheus metrics (`/metrics`).

Who sees what: every request needs credentials, HTTP Basic over the run's TLS: `operator` with the
operator's token, or `silo-<r>` with site r's token (the tokens `fedml-moon certs` writes; the server
holds their SHA-256 digests in server-tokens.json). Without them a client gets 401 and nothing else.
The operator sees every site and the metrics; a site sees what the run tells every site (round,
phase, the global test figures and curves, the pace, a DP run's epsilons) and its own entry among the
sites; where `tracking_args.status_sites_visible` says so, the others' lines too (state, last heard,
rounds, refusals: never their bytes or messages); `/metrics` is the operator's (403).

Off the training path: the port runs in threads of its own and reads the run's files (status.json,
metrics.jsonl, summary.json: what `fedml-moon status` reads), at most twice a second whatever the
number of readers; it never touches the server's objects. Each user from each client address (and
all requests without valid credentials from an address together) may make RATE requests in
RATE_WINDOW_S (then 429), at most MAX_OPEN connections are served at once (another is closed
unanswered), and RESERVED of them only to an address whose credentials the port took within KNOWN_S
(the operator's browser or Prometheus, a site's monitor): connections of strangers cannot hold every
slot. A connection's whole head (its TLS handshake, request line and headers) must arrive within
HEAD_DEADLINE_S, and a client that stalls after it is dropped after TIMEOUT_S. Only GET and HEAD are
answered, a request with a body (a Content-Length above 0, or Transfer-Encoding) is refused (413), one
whose Content-Length is not a count is refused (400), and what is refused is logged bounded (one line
per client a window, then counted: `status.refusals`): no reader can slow a round, flood its log, or
keep another reader out, and a killed one leaves nothing behind."""

from __future__ import annotations

import logging
import re
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fedml_moon.security import token_digest
from fedml_moon.status.app import RATE_WINDOW_S, StatusApp, load_viewers

log = logging.getLogger(__name__)

MAX_OPEN = 8
RESERVED = 2  # slots only an address that gave valid credentials within app.KNOWN_S may take
HEAD_DEADLINE_S = 5.0  # the TLS handshake, request line and headers together
TIMEOUT_S = 5.0
COUNT = re.compile(r"\d{1,18}")
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
}


class _Handler(BaseHTTPRequestHandler):
    server_version = "fedml-moon"
    sys_version = ""
    timeout = TIMEOUT_S

    def setup(self) -> None:
        # the whole head within HEAD_DEADLINE_S: past it the connection is shut, whatever it sends
        self._deadline = threading.Timer(HEAD_DEADLINE_S, self._drop)
        self._deadline.daemon = True
        self._deadline.start()
        super().setup()  # the socket's timeout set: a TLS handshake that stalls is dropped too
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()

    def _drop(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass

    def parse_request(self) -> bool:
        """The request line and headers are in: the head's deadline is met."""
        self._deadline.cancel()
        return super().parse_request()

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ssl.SSLError) as err:  # a client that stalls, or speaks no TLS
            log.debug("status port: %s dropped: %s", self.client_address[0], err)

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

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

    def _body_problem(self) -> tuple[int, str] | None:
        """(status, why) for a request that carries a body or says its length in another way."""
        length, chunked = self.headers.get("Content-Length"), self.headers.get("Transfer-Encoding")
        if length is not None and not COUNT.fullmatch(length.strip()):
            return 400, f"a Content-Length that is not a count ({length[:40]!r})"
        if chunked is not None or int(length or 0) > 0:
            return 413, "a request with a body"
        return None

    def _refuse_request(self, code: int, why: str) -> None:
        app: StatusApp = self.server.app  # type: ignore[attr-defined]
        client = self.client_address[0]
        app.refusals.refused(f"status port client {client}", f"status port: refused {client}: {why}", why)
        self._send(code, body=f"{why}: GET and HEAD carry none\n".encode())

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        app: StatusApp = self.server.app  # type: ignore[attr-defined]
        user = app.viewer(self.headers.get("Authorization"))
        if not app.allowed(f"{self.client_address[0]} {user}"):  # each user its own; no user: one
            return self._send(429, extra={"Retry-After": str(int(RATE_WINDOW_S))})
        problem = self._body_problem()
        if problem is not None:
            return self._refuse_request(*problem)
        if user is None:
            return self._send(401, extra={"WWW-Authenticate": 'Basic realm="fedml-moon status"'})
        app.vouch(self.client_address[0])
        self._send(*app.answer(self.path, user))

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(405, extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("status port: %s %s", self.client_address[0], fmt % args)


class _Server(ThreadingHTTPServer):
    """At most MAX_OPEN connections at once, RESERVED of them for addresses the port knows."""

    daemon_threads = True
    request_queue_size = MAX_OPEN

    def __init__(self, address: tuple[str, int], app: StatusApp) -> None:
        super().__init__(address, _Handler)
        self.app = app
        self.open = 0
        self.slots = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        known = self.app.known(client_address[0])
        with self.slots:
            room = self.open < (MAX_OPEN if known else MAX_OPEN - RESERVED)
            self.open += room
        if not room:  # too many at once: closed at once, unanswered
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.slots:
                self.open -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """What a request made fail is one bounded line of the log, never a traceback a client can
        repeat at will (its reason counted past the window's lines)."""
        err = sys.exc_info()[1]
        client = client_address[0] if client_address else "?"
        why = f"{type(err).__name__}: {str(err)[:80]}"
        self.app.refusals.refused(f"status port client {client}", f"status port: {client}: {why}", why)


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
