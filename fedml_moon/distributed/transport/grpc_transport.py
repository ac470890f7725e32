"""gRPC transport: only the server (rank 0) listens; silos connect out to it.

Two methods on a generic service (no generated code; frames are codec bytes), both request-streaming
so that the server's handler runs as a call arrives, before any of its request is read:
  /fedml_moon.Transport/Send       stream-unary, silo -> server (one request message: the frame)
  /fedml_moon.Transport/Subscribe  stream-stream, server -> silo (one request message: the 8-byte rank)
A silo behind NAT or a firewall that allows outgoing connections can take part, and start order does
not matter: silos call with `wait_for_ready`, and the server keeps each silo's frames until it has
subscribed. gRPC's own threads block while idle; nothing polls.

Security (`GrpcSecurity`): TLS with the server's certificate, which silos verify against the run's
CA; silos authenticate with mutual TLS (certificate common name `silo-<rank>`) or a per-silo token
(`authorization: Bearer ...` with `x-fedml-moon-rank`, checked against SHA-256 digests). The server
refuses any call that does not authenticate, any frame that is not a message, any message whose
sender is not the authenticated rank or not a rank of this run, and any subscription to another
rank's frames; oversized frames are refused by gRPC itself. It keeps running. A token is checked from
the call's headers before any of its frame is read (`_TokenGate`, a server interceptor).

Bounds on what a silo with valid credentials can hold (`slots`): each rank has at most 2 Send calls
in progress and 1 Subscribe stream (a newer Subscribe of the rank ends the older one); a Send over
its rank's slots is refused RESOURCE_EXHAUSTED before its request is read, and the thread pool holds
every rank's slots plus a margin, so an honest silo always finds a thread. A call whose request
message has not fully arrived `receive_timeout_s` after it started is cut by a watchdog. At most 16
messages and 2 x the frame limit + 1 MiB of one silo wait for the main thread (`inflight`); a Send
past that is refused RESOURCE_EXHAUSTED, which the silo retries with its back-off, as is a frame over
256 KiB past what the silo's phase takes of them (`budget`), before it is decoded; the C heap keeps
little of the frames read (`heap`). What one rank can cost the others' rounds: frames are decoded one
at a time, the least-served waiting rank first (`fair`), so while n ranks have frames waiting each
gets at least 1/n of the decoding, and an honest rank's frame waits for at most the one decode in
progress (`benchmarks/honest_pace.py`). Reading and taking frames: `grpc_frames`. With `auth: none`
(loopback development only) a caller has no identity before its request is read, so slots are kept
per peer host with larger caps (2 x workers + 2 Sends, workers + 1 Subscribes). Refusals are logged
bounded and rate-limited per rank or peer host (`RefusalLog`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterator
from concurrent import futures
from typing import Any

import grpc

from fedml_moon.distributed.transport.base import QueueTransport, message_bytes
from fedml_moon.distributed.transport.fair import FairTurns
from fedml_moon.distributed.transport.grpc_client import GrpcClientTransport
from fedml_moon.distributed.transport.grpc_common import (
    BUSY_HEADER,
    RANK,
    RANK_HEADER,
    SERVICE,
    GrpcSecurity,
    Refused,
    channel_options,
    peer_host,
    token_rank,
)
from fedml_moon.distributed.transport.grpc_frames import FramesIn, _Ended
from fedml_moon.distributed.transport.heap import HeapLimits
from fedml_moon.distributed.transport.inflight import coalesced_kind
from fedml_moon.distributed.transport.slots import Lease, Outbox, Slots, Watchdog, pool_size, slot_caps
from fedml_moon.security import cert_cap, rank_of_common_name
from fedml_moon.status.refusals import RefusalLog, bounded

__all__ = [
    "RANK_HEADER",
    "SERVICE",
    "GrpcClientTransport",
    "GrpcSecurity",
    "GrpcServerTransport",
    "Refused",
    "channel_options",
    "token_rank",
]
log = logging.getLogger(__name__)
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class _TokenGate(grpc.ServerInterceptor):
    """With `auth: token`, checks a call's token from its headers as the call arrives, before its
    request is read: a call that does not authenticate gets a handler that refuses without taking a
    message."""

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
            self.server._refuse(context, refused, peer_host(context.peer()))

        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.stream_unary_rpc_method_handler(refuse)


class GrpcServerTransport(FramesIn, QueueTransport):
    """Rank 0: serves Send (frames in) and Subscribe (one outgoing frame queue per silo rank)."""

    def __init__(
        self,
        host: str,
        port: int,
        max_message_mb: int,
        workers: int,
        security: GrpcSecurity | None = None,
        max_frame_bytes: int | None = None,
        receive_timeout_s: float = 300.0,
        refusals: RefusalLog | None = None,
        receive_window_kb: int = 1024,
    ) -> None:
        frame_bytes = max_frame_bytes or min(int(max_message_mb) << 20, 2**31 - 1)
        super().__init__(0, frame_bytes, refusals)
        self.security = security or GrpcSecurity()
        # rank -> the most samples its party may claim: from the token table, or its certificate
        self.caps: dict[int, int | None] = dict(self.security.caps or {})
        self.ranks = set(range(1, workers + 1))
        self.receive_timeout_s = float(receive_timeout_s)
        self._outboxes: dict[int, Outbox] = {}
        self._lock = threading.Lock()
        self.slots = Slots(*slot_caps(self.security.auth, workers))
        self.notices = RefusalLog(log, verb="noted")  # "rank r subscribed": a caller that churns is counted
        self.watchdog = Watchdog()
        self.heap = HeapLimits(self.budget.small_bytes)  # what the C heap keeps of the frames read
        self.turns = FairTurns()  # decoding: one frame at a time, the least-served rank first
        handlers = {
            "Send": grpc.stream_unary_rpc_method_handler(self._on_send),
            "Subscribe": grpc.stream_stream_rpc_method_handler(self._on_subscribe),
        }
        pool = futures.ThreadPoolExecutor(max_workers=pool_size(self.security.auth, workers))
        gate = [_TokenGate(self)] if self.security.auth == "token" else []
        self.server = grpc.server(
            pool,
            options=channel_options(max_message_mb, max_frame_bytes, receive_window_kb),
            interceptors=gate,
        )
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
        self.address = f"{host}:{port}"
        if self._bind() == 0:
            self.watchdog.stop()
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

    def _outbox(self, rank: int) -> Outbox:
        with self._lock:
            if rank not in self._outboxes:
                self._outboxes[rank] = Outbox(max_bytes=2 * self.inflight.max_bytes)
            return self._outboxes[rank]

    def _identify(self, context: grpc.ServicerContext) -> int | None:
        """The caller's authenticated rank (None with auth "none"); Refused when it has none."""
        sec = self.security
        if sec.auth == "mtls":
            auth = context.auth_context()
            names = auth.get("x509_common_name") or []
            rank = rank_of_common_name(names[0].decode()) if names else None
            if rank is None:
                raise Refused(grpc.StatusCode.UNAUTHENTICATED, "no silo certificate of this run")
            if rank not in self.caps and (pem := auth.get("x509_pem_cert")):
                self.caps[rank] = cert_cap(pem[0])  # the cap the CA signed into it, if any
            return rank
        if sec.auth == "token":  # already checked by _TokenGate before the request was read
            return token_rank(sec.tokens or {}, context.invocation_metadata())
        return None

    def _caller(self, context: grpc.ServicerContext, method: str) -> tuple[Hashable, str, int | None]:
        """(slot key, log source, rank) of a `method` call, from its credentials before its request
        is read: its rank, or with auth "none" its peer's host; Refused (busy) past its call rate."""
        rank = self._identify(context)
        if rank is None:
            host = peer_host(context.peer())
            key, source = host, host
        elif rank not in self.ranks:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"rank {rank} is not a rank of this run")
        else:
            key, source = rank, f"rank {rank}"
        if not self.slots.allow(method, key):
            if method == "Send" and rank is not None:
                self.count_frame(rank, "unread")
            per_s, burst = self.slots.rates[method].per_s, self.slots.rates[method].burst
            raise Refused(
                RESOURCE_EXHAUSTED,
                f"{source} starts {method} calls faster than {per_s:g} a second (bursts of {burst:g})",
                f"too many {method} calls a second",
                busy=True,
            )
        return key, source, rank

    def _refuse(self, context: grpc.ServicerContext, err: Refused, source: str) -> None:
        peer = bounded(context.peer(), 80)
        self.refuse(source, f"refused a call from {source} ({peer}): {err}", err.kind)
        if err.busy:
            context.set_trailing_metadata(((BUSY_HEADER, "1"),))
        context.abort(err.code, bounded(err, 300))

    def _on_send(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        source, rank = peer_host(context.peer()), None
        try:
            key, source, rank = self._caller(context, "Send")
            lease = Lease(context)
            if not self.slots.take("Send", key, lease):
                raise Refused(
                    RESOURCE_EXHAUSTED,
                    f"{source} already has {self.slots.caps['Send']} Send calls in progress",
                    "too many Send calls at once",
                    busy=True,
                )
            try:
                self._room(rank, 0)  # a rank with no room left is refused before its request is read
                self._read_and_take(requests, lease, source, rank)
            finally:
                self.slots.free("Send", key, lease)
        except Refused as err:
            if rank is not None and err.frame:
                self.count_frame(rank, err.frame)
            self._refuse(context, err, source)
        except _Ended:
            pass
        return b""

    def _on_subscribe(self, requests: Iterator[bytes], context: grpc.ServicerContext):
        source = peer_host(context.peer())
        try:
            key, source, rank = self._caller(context, "Subscribe")
            lease = Lease(context)
            if not context.add_callback(lambda: lease.end("", cancel=False)):  # called once it is over
                return
            self.slots.take("Subscribe", key, lease)
            try:
                wanted = self._wanted(self._read(requests, lease, source, "Subscribe"), rank)
                yield from self._stream(wanted, lease)
            finally:
                self.slots.free("Subscribe", key, lease)
        except Refused as err:
            self._refuse(context, err, source)
        except _Ended:
            return

    def _wanted(self, request: bytes, rank: int | None) -> int:
        if len(request) != RANK.size:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "subscribe with an 8-byte rank")
        (wanted,) = RANK.unpack(request)
        if (rank is not None and wanted != rank) or wanted not in self.ranks:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"rank {rank} asked for rank {wanted}'s frames")
        return wanted

    def _stream(self, wanted: int, lease: Lease) -> Iterator[bytes]:
        """Rank `wanted`'s frames, until the server closes, the call ends, or a newer Subscribe of
        the rank takes its place (Refused RESOURCE_EXHAUSTED)."""
        outbox = self._outbox(wanted)
        reader = outbox.claim()
        if lease.streaming(outbox.wake):
            self.notices.refused(f"rank {wanted}", f"rank {wanted} subscribed", "subscribed", logging.INFO)
            while (frame := outbox.next(reader, lease)) is not None:
                yield frame
        why = lease.ended or ("a newer Subscribe took its place" if outbox.replaced(reader) else "")
        if why:
            raise Refused(RESOURCE_EXHAUSTED, f"rank {wanted}'s stream ended: {why}", "stream replaced")

    def send_message(self, msg: Any) -> None:
        """Queue a message in its silo's outbox; a heartbeat joins one already waiting there."""
        data = message_bytes(msg)
        heartbeat = coalesced_kind(msg.get_type()) == "heartbeat"
        self.send_bytes(int(msg.get_receiver_id()), data, heartbeat)
        self.count_sent(int(msg.get_receiver_id()), len(data))

    def send_bytes(self, receiver: int, data: bytes, heartbeat: bool = False) -> None:
        """Queue a frame in `receiver`'s outbox (bounded: past it the oldest go, and the log says so)."""
        outbox = self._outbox(receiver)
        before = outbox.dropped
        outbox.put(data, heartbeat=heartbeat)
        if outbox.dropped > before:
            self.refuse(
                f"rank {receiver}",
                f"dropped {outbox.dropped - before} of the oldest frames waiting for rank {receiver}, which "
                f"is not reading them ({outbox.max_frames} frames at most wait per silo)",
                reason="outbox full",
            )

    def close(self) -> None:
        with self._lock:
            for outbox in self._outboxes.values():
                outbox.close()
        self.server.stop(grace=2.0).wait(5.0)
        self.watchdog.stop()
