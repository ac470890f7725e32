"""From the attacker's side: a site holding its valid token floods the gRPC server with valid
frames that are dear to decode (trees of many small numbers) from many connections, while an honest
silo sends its messages. The server decodes one frame at a time, the least-served rank first, and a
rank's decoding is bounded in time (`transport/fair.py`): every honest message is delivered, none
waits behind more than one flood frame's decode, and past its share the flooder's frames are refused
undecoded. Counted from the transport's counters; real gRPC with TLS and tokens on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.distributed.transport.base import message_bytes
from fedml_moon.distributed.transport.fair import FairTurns
from fedml_moon.distributed.transport.grpc_transport import (
    SERVICE,
    GrpcClientTransport,
    GrpcSecurity,
    GrpcServerTransport,
)
from fedml_moon.security import load_token_table, make_certs

pytestmark = pytest.mark.slow
CONNECTIONS, HONEST = 16, 10
BURST_S = 2.0  # the flooder's decoding, at no refill here: it lasts while the honest silo sends


def _dear_frame(rank: int) -> bytes:
    msg = Message("result", rank, 0)
    msg.add_params("model", {f"w{i}": [float(j) for j in range(100)] for i in range(400)})  # ~240 KB
    return message_bytes(msg)


def _wait_until(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()


def _flood(address: str, certs, stop: threading.Event, calls: list[int]) -> list[threading.Thread]:
    frame, token = _dear_frame(3), (certs / "silo-3.token").read_text()
    meta = (("x-fedml-moon-rank", "3"), ("authorization", f"Bearer {token}"))
    creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    options = [("grpc.use_local_subchannel_pool", 1)]

    def one() -> None:
        with grpc.secure_channel(address, creds, options=options) as channel:
            send = channel.stream_unary(f"/{SERVICE}/Send")
            for _ in range(2000):  # bounded; the test stops it long before
                if stop.is_set():
                    return
                try:
                    send(iter((frame,)), metadata=meta, timeout=5)
                except grpc.RpcError:
                    pass
                calls.append(1)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    return threads


def test_a_token_holders_flood_of_valid_frames_gets_a_bounded_share_of_decoding(tmp_path):
    certs = tmp_path / "certs"
    make_certs(certs, silos=3, hosts=["127.0.0.1"])
    read = lambda name: (certs / name).read_bytes()  # noqa: E731
    tokens = load_token_table(certs / "server-tokens.json")
    sec = GrpcSecurity(tls=True, auth="token", tokens=tokens, ca=read("ca.pem"), cert=read("server.pem"))
    sec.key = read("server.key")
    server = GrpcServerTransport("127.0.0.1", conformance.free_port(), 16, 3, sec, receive_timeout_s=10)
    server.turns = FairTurns(rate=0.0, burst_s=BURST_S)
    taken: list[int] = []

    class Take:
        def receive_message(self, kind, msg) -> None:
            taken.append(msg.get_sender_id())

    server.add_observer(Take())
    pump = threading.Thread(target=server.handle_receive_message, daemon=True)
    pump.start()
    silo_sec = GrpcSecurity(
        tls=True, ca=read("ca.pem"), auth="token", token=(certs / "silo-1.token").read_text()
    )
    silo = GrpcClientTransport(1, server.address, 16, 20, silo_sec)
    stop, calls = threading.Event(), []
    threads = _flood(server.address, certs, stop, calls)
    try:
        assert _wait_until(lambda: server.turns.turns[3] >= 2, 15.0)  # the flood is being decoded
        for i in range(HONEST):  # the honest silo's messages, each as dear as a flood frame
            silo.send_bytes(0, _dear_frame(1))
            assert _wait_until(lambda i=i: taken.count(1) == i + 1, 15.0), i
        assert _wait_until(lambda: server.frames[(3, "undecoded")] > 0, 15.0)  # past its share
        decoded = server.turns.turns[3]
        assert _wait_until(lambda: len(calls) >= decoded + 50, 15.0)  # the flood goes on ...
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        silo.stop_receive_message()
        server.stop_receive_message()
        pump.join(timeout=10)
    assert server.turns.turns[1] == HONEST and taken.count(1) == HONEST
    assert server.turns.behind[1] <= 1  # each honest frame waited for at most the decode in progress
    # ... and the flooder's decoding stopped at its burst: at most the 2 frames its Send slots held
    assert server.turns.turns[3] <= decoded + 2
    assert server.refusals.by_reason["decoding past its share"] > 0
