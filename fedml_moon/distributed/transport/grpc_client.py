"""A silo's side of the gRPC transport: it connects out to its server, sends each frame as the one
request message of a Send call, and receives on a Subscribe stream it re-opens when it breaks."""

from __future__ import annotations

import logging
import threading
import time

import grpc
from fedml.core.distributed.communication.message import Message

from fedml_moon.distributed.transport.base import QueueTransport, TransportError, message_bytes
from fedml_moon.distributed.transport.grpc_common import (
    RANK,
    RETRY_S,
    SERVICE,
    GrpcSecurity,
    busy,
    channel_options,
)

log = logging.getLogger(__name__)
# a Send the server did not take: cut (CANCELLED, e.g. a server too busy to read it in time), not
# reachable or too slow; a duplicate of one it did take is dropped there as late
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class GrpcClientTransport(QueueTransport):
    """A silo: sends with Send calls, receives on a Subscribe stream it re-opens if it breaks."""

    def __init__(
        self,
        rank: int,
        server: str,
        max_message_mb: int,
        timeout_s: float,
        security: GrpcSecurity | None = None,
    ) -> None:
        super().__init__(rank, max_frame_bytes=int(max_message_mb) << 20)
        self.server_address, self.timeout_s = server, timeout_s
        self.security = security or GrpcSecurity()
        self.metadata = self.security.metadata(rank)
        self.channel = self._channel(server, channel_options(max_message_mb))
        self._send = self.channel.stream_unary(f"/{SERVICE}/Send")
        self._subscribe = self.channel.stream_stream(f"/{SERVICE}/Subscribe")
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

    def send_bytes(self, receiver: int, data: bytes, within_s: float | None = None) -> None:
        """Send `data` to the server, retrying (with back-off, up to `within_s`, else `timeout_s`)
        while it cannot be reached or answers that it is busy (RESOURCE_EXHAUSTED from its per-silo
        bounds)."""
        if receiver != 0:
            raise ValueError(f"a silo sends to the server (rank 0) only, not to rank {receiver}")
        limit = self.timeout_s if within_s is None else within_s
        deadline, pause = time.monotonic() + limit, RETRY_S[0]
        while True:  # a call cut by a server that went away fails at once, whatever wait_for_ready says
            left = deadline - time.monotonic()
            call = self._send.future(
                iter((data,)), timeout=max(left, 0.01), wait_for_ready=True, metadata=self.metadata
            )
            try:
                while True:  # in short waits, so that a signal (Ctrl-C, SIGTERM) is handled meanwhile
                    try:
                        call.result(timeout=0.5)
                        return
                    except grpc.FutureTimeoutError:
                        continue
            except grpc.RpcError as err:
                if err.code() not in RETRIED and not busy(err):
                    raise
                if time.monotonic() + pause >= deadline:
                    raise TransportError(
                        f"the server at {self.server_address} did not take a message within "
                        f"{limit:g} s ({err.code().name}: {str(err.details())[:300]})"
                    ) from None
            except BaseException:  # SIGTERM or Ctrl-C while waiting: do not leave the call behind
                call.cancel()
                raise
            time.sleep(pause)  # a duplicate of a message the server did get is dropped there as late
            pause = min(2 * pause, RETRY_S[1])

    def try_send(self, msg: Message, within_s: float) -> bool:
        """Send `msg` if the server takes it within `within_s` (a HELLO to a server not up yet)."""
        data = message_bytes(msg)
        try:
            self.send_bytes(int(msg.get_receiver_id()), data, within_s)
        except TransportError:
            return False
        self.count_sent(int(msg.get_receiver_id()), len(data))
        return True

    def _receive_loop(self) -> None:
        """Subscribe, and subscribe again whenever the stream breaks (a restarted server): the first
        break is logged, the retries quietly, and the first frame after them again."""
        pause, broken = RETRY_S[0], False
        while self.running:
            self._stream = self._subscribe(
                iter((RANK.pack(self.rank),)), wait_for_ready=True, metadata=self.metadata
            )
            try:
                for frame in self._stream:
                    if broken:
                        log.info("rank %d: subscribed to %s again", self.rank, self.server_address)
                    pause, broken = RETRY_S[0], False
                    self.deliver(frame, "the server")
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
