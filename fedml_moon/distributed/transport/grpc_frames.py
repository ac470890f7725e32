"""The frames that come in on the gRPC server's Send calls (a mixin of `GrpcServerTransport`): a call's
one request read under the watchdog's deadline, then refused by its sender's bounds before it is
decoded (what waits, `inflight`; the large frames its phase takes, `budget`), counted, decoded one at a
time, least-served rank first (`fair`), and queued; the heap trimmed after a large one (`heap`)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from fedml_moon.core.codec import CodecError
from fedml_moon.distributed.transport.base import message_from_bytes
from fedml_moon.distributed.transport.fair import FairTurns
from fedml_moon.distributed.transport.grpc_common import Refused
from fedml_moon.distributed.transport.inflight import REFUSED
from fedml_moon.distributed.transport.slots import Lease

RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class _Ended(Exception):
    """The call was cut (by the watchdog, or a newer Subscribe of its caller) while its request was
    read; it is already cancelled and logged."""


class FramesIn:
    """`GrpcServerTransport`'s reading and taking of the frames its Send calls bring."""

    turns: FairTurns  # decoding, one frame at a time, least-served rank first

    def expect(self, owed: dict[int, int]) -> None:
        """A new phase (see `QueueTransport.expect`): every rank's decoding time counts from zero."""
        super().expect(owed)
        self.turns.reset()

    def _read(self, requests: Iterator[bytes], lease: Lease, source: str, method: str) -> bytes:
        """The call's one request message; the call is cut if it has not arrived in time."""

        def cut() -> None:
            self.refuse(
                source,
                f"cut a {method} call from {source}: its request did not arrive within "
                f"{self.receive_timeout_s:g} s (comm_args.receive_timeout_s)",
                "request not in time",
            )
            lease.end("its request did not arrive in time")

        handle = self.watchdog.arm(self.receive_timeout_s, cut)
        try:
            return next(requests)
        except grpc.RpcError:  # the call ended while its request was read: gRPC ends it quietly
            if lease.ended is not None:
                raise _Ended() from None
            raise
        except StopIteration:
            if lease.ended is not None:
                raise _Ended() from None
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"a {method} call without a request") from None
        finally:
            self.watchdog.disarm(handle)

    def _read_and_take(self, requests: Iterator[bytes], lease: Lease, source: str, rank: int | None) -> None:
        """Read a Send's frame and take it (`_take`); then, its bytes let go, the heap is trimmed if
        it is time (`heap`)."""
        data = self._read(requests, lease, source, "Send")
        size = len(data)
        try:
            self._take(data, rank)
        finally:
            del data
            self.heap.read(size)

    def _room(self, rank: int | None, size: int) -> None:
        """Refused (busy) when `rank` has no room for `size` more bytes waiting (0: for any message)."""
        if rank is not None and not self.inflight.room(rank, size):
            raise Refused(
                RESOURCE_EXHAUSTED,
                self.inflight.describe(rank),
                "too many messages waiting",
                busy=True,
                frame="undecoded" if size else "unread",
            )

    def _take(self, data: bytes, rank: int | None) -> None:
        """Queue the message in `data` from a caller authenticated as `rank`; Refused if it is not a
        message of that rank to the server, or its rank is over its in-flight bound or past the
        large frames its phase takes (by its size before it is decoded; the bound again as it is
        queued) or past its decoding time (`fair`)."""
        self._room(rank, len(data))
        if rank is not None:
            if not self.turns.within(rank):
                raise Refused(
                    RESOURCE_EXHAUSTED,
                    self.turns.describe(rank),
                    "decoding past its share",
                    busy=True,
                    frame="undecoded",
                )
            if not self.budget.take(rank, len(data)):
                raise Refused(
                    RESOURCE_EXHAUSTED,
                    self.budget.describe(rank, len(data)),
                    "frames beyond the phase",
                    busy=True,
                    frame="undecoded",
                )
            self.count_frame(rank, "decoded")
        try:
            with self.turns.turn(rank if rank is not None else "unauthenticated"):
                msg = message_from_bytes(data)
        except CodecError as err:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"not a message ({len(data)} bytes): {err}", frame=""
            ) from None
        sender = msg.get_sender_id()
        if (rank is not None and sender != rank) or sender not in self.ranks or msg.get_receiver_id() != 0:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"a message from rank {sender} to rank {msg.get_receiver_id()} sent by rank {rank}",
                frame="",
            )
        if self.admit(msg, len(data)) == REFUSED:
            raise Refused(
                RESOURCE_EXHAUSTED,
                self.inflight.describe(sender),
                "too many messages waiting",
                busy=True,
                frame="",
            )
        self.bytes_received += len(data)
