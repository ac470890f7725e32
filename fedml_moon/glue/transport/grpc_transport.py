"""gRPC transport: only the server (rank 0) listens; silos connect out to it.

Two methods on a generic service (no generated code; frames are codec bytes):
  /fedml_moon.Transport/Send       unary, silo -> server
  /fedml_moon.Transport/Subscribe  server-streaming, server -> silo (the request names the silo's rank)
A silo behind NAT or a firewall that allows outgoing connections can take part, and start order does
not matter: silos call with `wait_for_ready`, and the server keeps each silo's frames until it has
subscribed. gRPC's own threads block while idle; nothing polls.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
from concurrent import futures

import grpc

from fedml_moon.glue.transport.base import QueueTransport

log = logging.getLogger(__name__)
SERVICE = "fedml_moon.Transport"
_RANK = struct.Struct("<q")
_END = object()
RETRY_S = (0.2, 5.0)


def channel_options(max_message_mb: int) -> list[tuple[str, int]]:
    size = min(int(max_message_mb) * 1024 * 1024, 2**31 - 1)
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.enable_http_proxy", 0),
    ]


class GrpcServerTransport(QueueTransport):
    """Rank 0: serves Send (frames in) and Subscribe (one outgoing frame queue per silo rank)."""

    def __init__(self, host: str, port: int, max_message_mb: int, workers: int) -> None:
        super().__init__(0)
        self._outboxes: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        handlers = {
            "Send": grpc.unary_unary_rpc_method_handler(self._on_send),
            "Subscribe": grpc.unary_stream_rpc_method_handler(self._on_subscribe),
        }
        pool = futures.ThreadPoolExecutor(max_workers=max(4, 2 * workers + 2))
        self.server = grpc.server(pool, options=channel_options(max_message_mb))
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
        self.address = f"{host}:{port}"
        if self.server.add_insecure_port(self.address) == 0:
            raise OSError(f"cannot listen on {self.address} (in use, or not an address of this host)")
        self.server.start()
        log.info("gRPC server listening on %s", self.address)

    def _outbox(self, rank: int) -> queue.Queue:
        with self._lock:
            return self._outboxes.setdefault(rank, queue.Queue())

    def _on_send(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.deliver(request)
        return b""

    def _on_subscribe(self, request: bytes, context: grpc.ServicerContext):
        if len(request) != _RANK.size:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "subscribe with an 8-byte rank")
        (rank,) = _RANK.unpack(request)
        outbox = self._outbox(rank)
        log.info("rank %d subscribed", rank)
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

    def __init__(self, rank: int, server: str, max_message_mb: int, timeout_s: float) -> None:
        super().__init__(rank)
        self.server_address, self.timeout_s = server, timeout_s
        self.channel = grpc.insecure_channel(server, options=channel_options(max_message_mb))
        self._send = self.channel.unary_unary(f"/{SERVICE}/Send")
        self._subscribe = self.channel.unary_stream(f"/{SERVICE}/Subscribe")
        self._thread = threading.Thread(target=self._receive_loop, name=f"grpc-recv-{rank}", daemon=True)
        self._thread.start()

    def send_bytes(self, receiver: int, data: bytes) -> None:
        if receiver != 0:
            raise ValueError(f"a silo sends to the server (rank 0) only, not to rank {receiver}")
        self._send(data, timeout=self.timeout_s, wait_for_ready=True)

    def _receive_loop(self) -> None:
        pause = RETRY_S[0]
        while self.running:
            self._stream = self._subscribe(_RANK.pack(self.rank), wait_for_ready=True)
            try:
                for frame in self._stream:
                    pause = RETRY_S[0]
                    self.deliver(frame)
            except grpc.RpcError as err:
                if not self.running:
                    return
                log.info(
                    "rank %d: the subscription to %s ended (%s); retrying",
                    self.rank,
                    self.server_address,
                    err.code(),
                )
            time.sleep(pause)
            pause = min(2 * pause, RETRY_S[1])

    def close(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.cancel()
        self.channel.close()
