"""gRPC transport: only the server (rank 0) listens; silos connect out to it.

Two methods on a generic service (no generated code; frames are codec bytes):
  /fedml_moon.Transport/Send       unary, silo -> server
  /fedml_moon.Transport/Subscribe  server-streaming, server -> silo (the request names the silo's rank)
A silo behind NAT or a firewall that allows outgoing connections can take part, and start order does
not matter: silos call with `wait_for_ready`, and the server keeps each silo's frames until it has
subscribed. gRPC's own threads block while idle; nothing polls.

Security (`GrpcSecurity`): TLS with the server's certificate, which silos verify against the run's
CA; silos authenticate with mutual TLS (certificate common name `silo-<rank>`) or a per-silo token
(`authorization: Bearer ...` with `x-fedml-moon-rank`, checked against SHA-256 digests). The server
refuses, and logs with the peer's address, any call that does not authenticate, any frame that is not
a message, any message whose sender is not the authenticated rank or not a rank of this run, and any
subscription to another rank's frames; oversized frames are refused by gRPC itself. It keeps running.
A token is checked from the call's headers before any of its frame is read (`_TokenGate`, a server
interceptor), so a caller without one cannot make the server take in a frame of up to its limit.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc

from fedml_moon.core.codec import CodecError
from fedml_moon.distributed.transport.base import QueueTransport, TransportError, message_from_bytes
from fedml_moon.security import check_token, rank_of_common_name

log = logging.getLogger(__name__)
SERVICE = "fedml_moon.Transport"
_RANK = struct.Struct("<q")
_END = object()
RETRY_S = (0.2, 2.0)  # back-off of a silo reconnecting to its server (seconds)


RANK_HEADER = "x-fedml-moon-rank"


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

    def metadata(self, rank: int) -> tuple[tuple[str, str], ...]:
        if self.auth != "token":
            return ()
        return ((RANK_HEADER, str(rank)), ("authorization", f"Bearer {self.token}"))


class Refused(Exception):
    """A call the server does not accept (the reason goes to the log and to the caller)."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def channel_options(max_message_mb: int, receive_bytes: int | None = None) -> list[tuple[str, int]]:
    """gRPC's limits: `max_message_mb` both ways, or `receive_bytes` for what comes in (gRPC refuses
    a larger frame as it arrives, before the handler or anything else sees it)."""
    size = min(int(max_message_mb) * 1024 * 1024, 2**31 - 1)
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", min(size, receive_bytes or size)),
        ("grpc.enable_http_proxy", 0),
    ]


def token_rank(tokens: dict[int, str], metadata) -> int:
    """The rank a call's headers (`x-fedml-moon-rank`, `authorization: Bearer ...`) authenticate as;
    Refused (UNAUTHENTICATED) when they do not."""
    meta = dict(metadata or ())
    claimed, bearer = meta.get(RANK_HEADER, ""), meta.get("authorization", "")
    token = bearer[len("Bearer ") :] if bearer.startswith("Bearer ") else ""
    if not (claimed.isascii() and claimed.isdigit()) or not check_token(tokens, int(claimed), token):
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"bad or missing token for rank {claimed!r}")
    return int(claimed)


class _TokenGate(grpc.ServerInterceptor):
    """With `auth: token`, checks a call's token from its headers as the call arrives, before its
    request is read: a call that does not authenticate gets a request-streaming handler that refuses
    without taking a message (gRPC's Python server starts receiving a unary request before its
    handler runs, and a streaming one only when the handler iterates over it)."""

    def __init__(self, server: GrpcServerTransport) -> None:
        self.server = server

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # no such method: gRPC answers UNIMPLEMENTED, reading nothing either
        try:
            token_rank(self.server.security.tokens or {}, handler_call_details.invocation_metadata)
            return handler
        except Refused as err:
            refused = err

        def refuse(_requests, context):  # never iterates `_requests`: no request bytes are read
            self.server._refuse(context, refused)

        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.stream_unary_rpc_method_handler(refuse)


class GrpcServerTransport(QueueTransport):
    """Rank 0: serves Send (frames in) and Subscribe (one outgoing frame queue per silo rank)."""

    def __init__(
        self,
        host: str,
        port: int,
        max_message_mb: int,
        workers: int,
        security: GrpcSecurity | None = None,
        max_frame_bytes: int | None = None,
    ) -> None:
        super().__init__(0)
        self.security = security or GrpcSecurity()
        self.ranks = set(range(1, workers + 1))
        self._outboxes: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        handlers = {
            "Send": grpc.unary_unary_rpc_method_handler(self._on_send),
            "Subscribe": grpc.unary_stream_rpc_method_handler(self._on_subscribe),
        }
        pool = futures.ThreadPoolExecutor(max_workers=max(4, 2 * workers + 2))
        gate = [_TokenGate(self)] if self.security.auth == "token" else []
        self.server = grpc.server(
            pool, options=channel_options(max_message_mb, max_frame_bytes), interceptors=gate
        )
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
        self.address = f"{host}:{port}"
        if self._bind() == 0:
            raise OSError(f"cannot listen on {self.address} (in use, or not an address of this host)")
        self.server.start()
        log.info(
            "gRPC server listening on %s (TLS %s, auth %s)",
            self.address,
            self.security.tls,
            self.security.auth,
        )

    def _bind(self) -> int:
        sec = self.security
        if not sec.tls:
            return self.server.add_insecure_port(self.address)
        mtls = sec.auth == "mtls"
        creds = grpc.ssl_server_credentials(
            [(sec.key, sec.cert)], root_certificates=sec.ca if mtls else None, require_client_auth=mtls
        )
        return self.server.add_secure_port(self.address, creds)

    def _outbox(self, rank: int) -> queue.Queue:
        with self._lock:
            return self._outboxes.setdefault(rank, queue.Queue())

    def _identify(self, context: grpc.ServicerContext) -> int | None:
        """The caller's authenticated rank (None with auth "none"); Refused when it has none."""
        sec = self.security
        if sec.auth == "mtls":
            names = context.auth_context().get("x509_common_name") or []
            rank = rank_of_common_name(names[0].decode()) if names else None
            if rank is None:
                raise Refused(grpc.StatusCode.UNAUTHENTICATED, "no silo certificate of this run")
            return rank
        if sec.auth == "token":  # already checked by _TokenGate before the request was read
            return token_rank(sec.tokens or {}, context.invocation_metadata())
        return None

    def _refuse(self, context: grpc.ServicerContext, err: Refused) -> None:
        log.warning("refused a call from %s: %s", context.peer(), err)
        context.abort(err.code, str(err))

    def _on_send(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            rank = self._identify(context)
            try:
                msg = message_from_bytes(request)
            except CodecError as err:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, f"not a message ({len(request)} bytes): {err}"
                ) from None
            sender = msg.get_sender_id()
            if (
                (rank is not None and sender != rank)
                or sender not in self.ranks
                or msg.get_receiver_id() != 0
            ):
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"a message from rank {sender} to rank {msg.get_receiver_id()} sent by rank {rank}",
                )
        except Refused as err:
            self._refuse(context, err)
        self.bytes_received += len(request)
        self._inbox.put(msg)
        return b""

    def _on_subscribe(self, request: bytes, context: grpc.ServicerContext):
        try:
            rank = self._identify(context)
            if len(request) != _RANK.size:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "subscribe with an 8-byte rank")
            (wanted,) = _RANK.unpack(request)
            if (rank is not None and wanted != rank) or wanted not in self.ranks:
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED, f"rank {rank} asked for rank {wanted}'s frames"
                )
        except Refused as err:
            self._refuse(context, err)
        outbox = self._outbox(wanted)
        log.info("rank %d subscribed", wanted)
        while self.running and context.is_active():
            try:
                frame = outbox.get(timeout=1.0)
            except queue.Empty:
                continue
            if frame is _END:
                return
            yield frame

    def send_bytes(self, receiver: int, data: bytes) -> None:
        self._outbox(receiver).put(data)

    def close(self) -> None:
        with self._lock:
            for outbox in self._outboxes.values():
                outbox.put(_END)
        self.server.stop(grace=2.0).wait(5.0)


class GrpcClientTransport(QueueTransport):
    """A silo: sends with unary calls, receives on a Subscribe stream it re-opens if it breaks."""

    def __init__(
        self,
        rank: int,
        server: str,
        max_message_mb: int,
        timeout_s: float,
        security: GrpcSecurity | None = None,
    ) -> None:
        super().__init__(rank)
        self.server_address, self.timeout_s = server, timeout_s
        self.security = security or GrpcSecurity()
        self.metadata = self.security.metadata(rank)
        self.channel = self._channel(server, channel_options(max_message_mb))
        self._send = self.channel.unary_unary(f"/{SERVICE}/Send")
        self._subscribe = self.channel.unary_stream(f"/{SERVICE}/Subscribe")
        self._thread = threading.Thread(target=self._receive_loop, name=f"grpc-recv-{rank}", daemon=True)
        self._thread.start()

    def _channel(self, server: str, options: list) -> grpc.Channel:
        sec = self.security
        if not sec.tls:
            return grpc.insecure_channel(server, options=options)
        mtls = sec.auth == "mtls"
        creds = grpc.ssl_channel_credentials(
            root_certificates=sec.ca,
            private_key=sec.key if mtls else None,
            certificate_chain=sec.cert if mtls else None,
        )
        return grpc.secure_channel(server, creds, options=options)

    def send_bytes(self, receiver: int, data: bytes) -> None:
        if receiver != 0:
            raise ValueError(f"a silo sends to the server (rank 0) only, not to rank {receiver}")
        deadline, pause = time.monotonic() + self.timeout_s, RETRY_S[0]
        while True:  # a call cut by a server that went away fails at once, whatever wait_for_ready says
            left = deadline - time.monotonic()
            call = self._send.future(
                data, timeout=max(left, 0.01), wait_for_ready=True, metadata=self.metadata
            )
            try:
                while True:  # in short waits, so that a signal (Ctrl-C, SIGTERM) is handled meanwhile
                    try:
                        call.result(timeout=0.5)
                        return
                    except grpc.FutureTimeoutError:
                        continue
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if time.monotonic() + pause >= deadline:
                    raise TransportError(
                        f"the server at {self.server_address} did not take a message within "
                        f"{self.timeout_s:g} s ({err.code().name}: {str(err.details())[:300]})"
                    ) from None
            except BaseException:  # SIGTERM or Ctrl-C while waiting: do not leave the call behind
                call.cancel()
                raise
            time.sleep(pause)  # a duplicate of a message the server did get is dropped there as late
            pause = min(2 * pause, RETRY_S[1])

    def _receive_loop(self) -> None:
        """Subscribe, and subscribe again whenever the stream breaks (a restarted server): the first
        break is logged, the retries quietly, and the first frame after them again."""
        pause, broken = RETRY_S[0], False
        while self.running:
            self._stream = self._subscribe(_RANK.pack(self.rank), wait_for_ready=True, metadata=self.metadata)
            try:
                for frame in self._stream:
                    if broken:
                        log.info("rank %d: subscribed to %s again", self.rank, self.server_address)
                    pause, broken = RETRY_S[0], False
                    self.deliver(frame)
            except grpc.RpcError as err:
                if not self.running:
                    return
                (log.debug if broken else log.warning)(
                    "rank %d: the subscription to %s ended (%s); subscribing again until it answers",
                    self.rank,
                    self.server_address,
                    err.code().name,
                )
                broken = True
            time.sleep(pause)
            pause = min(2 * pause, RETRY_S[1])

    def close(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.cancel()
        self.channel.close()
