"""What the gRPC server and its silos share: the service's names, security settings, channel limits,
the token check and the errors the server answers with."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from urllib.parse import unquote

import grpc

from fedml_moon.security import check_token
from fedml_moon.status.refusals import bounded

SERVICE = "fedml_moon.Transport"
RANK_HEADER = "x-fedml-moon-rank"
BUSY_HEADER = "x-fedml-moon-busy"  # on a RESOURCE_EXHAUSTED the caller may retry after a pause
RANK = struct.Struct("<q")
RETRY_S = (0.2, 2.0)  # back-off of a silo reconnecting to its server (seconds)


@dataclass
class GrpcSecurity:
    """TLS and silo authentication. `auth`: "mtls", "token" or "none" (loopback development only)."""

    tls: bool = False
    ca: bytes | None = None
    cert: bytes | None = None  # this process's certificate (the server's; a silo's with mtls)
    key: bytes | None = None
    auth: str = "none"
    token: str | None = None  # a silo's own token
    tokens: dict[int, str] | None = None  # the server's table: rank -> SHA-256 of the token
    caps: dict[int, int] | None = None  # the server's: rank -> its party's cap on claimed samples

    def metadata(self, rank: int) -> tuple[tuple[str, str], ...]:
        if self.auth != "token":
            return ()
        return ((RANK_HEADER, str(rank)), ("authorization", f"Bearer {self.token}"))


class Refused(Exception):
    """A call the server does not accept: `code` and the reason go to the caller and (bounded) to the
    log; `kind` is the short reason refusals are counted under; `busy` marks one the caller may
    retry (its rank's slots or in-flight bound were full); `frame` is what a refused Send's frame is
    counted as: "unread", "undecoded", or "" (it was decoded, and counted so)."""

    def __init__(
        self, code: grpc.StatusCode, reason: str, kind: str = "", busy: bool = False, frame: str = "unread"
    ) -> None:
        super().__init__(reason)
        self.code, self.kind, self.busy, self.frame = code, kind or code.name, busy, frame


def busy(err: grpc.RpcError) -> bool:
    """Whether a failed call was refused by a busy server (retry later) rather than for good."""
    if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    return any(key == BUSY_HEADER for key, _ in err.trailing_metadata() or ())


def channel_options(
    max_message_mb: int, receive_bytes: int | None = None, receive_window_kb: int = 0
) -> list[tuple[str, int]]:
    """gRPC's limits: `max_message_mb` both ways, or `receive_bytes` for what comes in (gRPC refuses
    a larger frame as it arrives, before the handler or anything else sees it). `receive_window_kb`
    (a server's; 0: gRPC's own) fixes how far gRPC reads ahead on each incoming call, in place of
    its bandwidth-delay probing, which widens the window to the size of the frames a caller sends."""
    size = min(int(max_message_mb) * 1024 * 1024, 2**31 - 1)
    options = [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", min(size, receive_bytes or size)),
        ("grpc.enable_http_proxy", 0),
    ]
    if receive_window_kb:
        window = int(receive_window_kb) * 1024
        options += [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window)]
    return options


def token_rank(tokens: dict[int, str], metadata) -> int:
    """The rank a call's headers (`x-fedml-moon-rank`, `authorization: Bearer ...`) authenticate as;
    Refused (UNAUTHENTICATED) when they do not."""
    meta = dict(metadata or ())
    claimed, bearer = meta.get(RANK_HEADER, ""), meta.get("authorization", "")
    token = bearer[len("Bearer ") :] if bearer.startswith("Bearer ") else ""
    if not (claimed.isascii() and claimed.isdigit()) or not check_token(tokens, int(claimed), token):
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            f"bad or missing token for rank {bounded(repr(claimed), 40)}",
            "bad or missing token",
        )
    return int(claimed)


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string, without its port: `ipv4:10.0.0.7:5123` -> `10.0.0.7`,
    `ipv6:[::1]:5123` -> `::1` (other forms, bounded, as they are)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return bounded(rest.rsplit(":", 1)[0].strip("[]"), 64)
    return bounded(peer, 64)
