"""What a peer with valid credentials, or none, can no longer do to the server's transport: hold its
threads (per-rank slots, a watchdog on requests that do not arrive), fill its queue (a bounded number
of messages and bytes waiting per sender, heartbeats coalesced), or flood its log (refusals bounded
and rate-limited per source). Real gRPC servers and a real mosquitto on 127.0.0.1; every thread,
channel, server and process started here is stopped at the end."""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.distributed.transport.base import QueueTransport, message_bytes
from fedml_moon.distributed.transport.budget import SMALL_FRAME_BYTES, SPARE_FRAMES, FrameBudget
from fedml_moon.distributed.transport.grpc_common import BUSY_HEADER, peer_host
from fedml_moon.distributed.transport.grpc_transport import (
    SERVICE,
    GrpcClientTransport,
    GrpcSecurity,
    GrpcServerTransport,
)
from fedml_moon.distributed.transport.inflight import MAX_MESSAGES, InFlight
from fedml_moon.security import load_token_table, make_certs
from fedml_moon.status.refusals import RefusalLog

pytestmark = pytest.mark.slow
RANK = struct.Struct("<q")
CUT_S = 3.0  # receive_timeout_s of the servers here
MARGIN_S = 2.5


class Inbox:
    def __init__(self) -> None:
        self.got: list[Message] = []

    def receive_message(self, kind, msg) -> None:
        self.got.append(msg)

    def wait(self, n: int, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.got) >= n


def _msg(kind, sender: int, receiver: int = 0, **params) -> Message:
    msg = Message(kind, sender, receiver)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder, silos=3, hosts=["127.0.0.1"])
    return folder


class Net:
    """Servers, silos, channels, pumps and blocked request iterators of one test, all stopped at the end."""

    def __init__(self, certs, auth: str) -> None:
        self.certs, self.auth = certs, auth
        self.transports: list[QueueTransport] = []
        self.channels: list[grpc.Channel] = []
        self.pumps: list[threading.Thread] = []
        self.release = threading.Event()  # ends every blocked request iterator

    def read(self, name: str) -> bytes:
        return (self.certs / name).read_bytes()

    def security(self, name: str, **kw) -> GrpcSecurity:
        if self.auth == "none":
            return GrpcSecurity()
        auth = "mtls" if self.auth == "mtls" else "token"
        cert = name if (auth == "mtls" or name == "server") else None
        return GrpcSecurity(
            tls=True,
            ca=self.read("ca.pem"),
            cert=self.read(f"{cert}.pem") if cert else None,
            key=self.read(f"{cert}.key") if cert else None,
            auth=auth,
            **kw,
        )

    def server(self, workers: int = 3, pump: bool = True, **kw) -> tuple[GrpcServerTransport, Inbox]:
        tokens = load_token_table(self.certs / "server-tokens.json") if self.auth == "token" else None
        sec = self.security("server", tokens=tokens)
        server = GrpcServerTransport(
            "127.0.0.1", conformance.free_port(), 16, workers, sec, receive_timeout_s=CUT_S, **kw
        )
        self.transports.append(server)
        inbox = Inbox()
        if pump:
            self.pump(server, inbox)
        return server, inbox

    def pump(self, transport: QueueTransport, inbox: Inbox) -> None:
        transport.add_observer(inbox)
        thread = threading.Thread(target=transport.handle_receive_message, daemon=True)
        thread.start()
        self.pumps.append(thread)

    def silo(self, rank: int, address: str) -> tuple[GrpcClientTransport, Inbox]:
        token = (self.certs / f"silo-{rank}.token").read_text() if self.auth == "token" else None
        silo = GrpcClientTransport(rank, address, 16, 10, self.security(f"silo-{rank}", token=token))
        self.transports.append(silo)
        inbox = Inbox()
        self.pump(silo, inbox)
        return silo, inbox

    def channel(self, address: str, rank: int) -> grpc.Channel:
        if self.auth == "none":
            channel = grpc.insecure_channel(address)
        else:
            mtls = self.auth == "mtls"
            creds = grpc.ssl_channel_credentials(
                self.read("ca.pem"),
                self.read(f"silo-{rank}.key") if mtls else None,
                self.read(f"silo-{rank}.pem") if mtls else None,
            )
            channel = grpc.secure_channel(address, creds)
        self.channels.append(channel)
        return channel

    def metadata(self, rank: int) -> tuple[tuple[str, str], ...]:
        if self.auth != "token":
            return ()
        return (("x-fedml-moon-rank", str(rank)), ("authorization", f"Bearer {self.token(rank)}"))

    def token(self, rank: int) -> str:
        return (self.certs / f"silo-{rank}.token").read_text()

    def blocked(self) -> Iterator[bytes]:
        """A request iterator whose message never arrives (until the test ends)."""
        self.release.wait(30)
        yield from ()

    def stop(self) -> None:
        self.release.set()
        for channel in self.channels:
            channel.close()
        for transport in self.transports:
            transport.stop_receive_message()
        for thread in self.pumps:
            thread.join(timeout=10)


@pytest.fixture
def net(certs, request):
    nets: list[Net] = []

    def make(auth: str = "token") -> Net:
        nets.append(Net(certs, auth))
        return nets[-1]

    yield make
    for n in nets:
        n.stop()


def _wait_until(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()


def _accounted(caplog, logger: str, full_prefix: str, source: str, expected: int) -> tuple[list, list]:
    """The full refusal lines and the summaries of `source` that `logger` wrote, once together they
    count `expected` refusals (waiting up to 10 s for the flush timer to summarise the last window);
    checks they count no more than that."""

    def split() -> tuple[list, list]:
        lines = [r.getMessage() for r in caplog.records if r.name == logger]
        full = [line for line in lines if line.startswith(full_prefix)]
        summary = f" more from {source} "
        summaries = [line for line in lines if line.startswith("refused ") and summary in line]
        return full, summaries

    def count() -> int:
        full, summaries = split()
        return len(full) + sum(int(line.split()[1]) for line in summaries)

    _wait_until(lambda: count() >= expected)
    full, summaries = split()
    assert count() == expected, (full[-2:], summaries)
    return full, summaries


def _busy(err: grpc.RpcError) -> bool:
    return err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        k == BUSY_HEADER for k, _ in err.trailing_metadata() or ()
    )


@pytest.mark.parametrize("auth", ["token", "mtls"])
def test_a_silo_holding_calls_open_cannot_starve_the_honest_silos(net, auth, caplog):
    n = net(auth)
    server, server_inbox = n.server(refusals=RefusalLog(logging.getLogger("fedml_moon.test"), per_source=50))
    (silo1, inbox1), (silo2, inbox2) = n.silo(1, server.address), n.silo(2, server.address)
    attacker = n.channel(server.address, 3)
    meta = n.metadata(3)
    send = attacker.stream_unary(f"/{SERVICE}/Send")
    subscribe = attacker.stream_stream(f"/{SERVICE}/Subscribe")
    start = time.monotonic()
    sends = [send.future(n.blocked(), metadata=meta, timeout=20) for _ in range(8)]
    streams = [subscribe(iter([RANK.pack(3)]), metadata=meta, timeout=20) for _ in range(12)]
    assert _wait_until(lambda: sum(s.done() for s in streams) == 11 and sum(f.done() for f in sends) == 6)
    held_subscribe = subscribe(n.blocked(), metadata=meta, timeout=20)  # ends the 12th stream
    assert _wait_until(lambda: all(s.done() for s in streams))
    assert server.slots.held("Send", 3) == 2 and server.slots.held("Subscribe", 3) == 1

    for silo, inbox, rank in ((silo1, inbox1, 1), (silo2, inbox2, 2)):  # meanwhile, the honest silos
        began = time.monotonic()
        silo.send_message(_msg("hello", rank))
        server.send_message(_msg("welcome", 0, rank, n=rank))
        assert inbox.wait(1, 3.0) and inbox.got[0].get("n") == rank
        assert time.monotonic() - began < 3.0
    assert server_inbox.wait(2, 3.0)
    assert sorted(m.get_sender_id() for m in server_inbox.got) == [1, 2]
    assert server.slots.held("Send", 3) == 2  # the honest silos did it while the attacker held its slots

    refused = [f for f in sends if f.done() and f.exception() is not None and _busy(f.exception())]
    assert len(refused) == 6
    for call in (*[f for f in sends if f not in refused], held_subscribe):  # cut by the watchdog
        assert _wait_until(call.done, CUT_S + MARGIN_S - (time.monotonic() - start))
        assert call.code() == grpc.StatusCode.CANCELLED
    assert time.monotonic() - start < CUT_S + MARGIN_S
    ended = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}  # CANCELLED: before its request
    assert all(s.code() in ended for s in streams)
    assert server.slots.peak[("Send", 3)] == 2 and server.slots.peak[("Subscribe", 3)] == 1
    assert _wait_until(lambda: server.slots.held("Send", 3) == 0 and server.slots.held("Subscribe", 3) == 0)
    assert caplog.text.count("cut a Send call from rank 3") == 2
    assert "cut a Subscribe call from rank 3" in caplog.text
    silo1.send_message(_msg("bye", 1))  # still serving
    assert server_inbox.wait(3)


def test_without_authentication_slots_are_kept_per_host(net):
    """auth: none (loopback development): 2 x workers + 2 Sends and workers + 1 Subscribes per host."""
    n = net("none")
    server, _ = n.server(workers=1)
    channel = n.channel(server.address, 1)
    send = channel.stream_unary(f"/{SERVICE}/Send")
    calls = [send.future(n.blocked(), timeout=20) for _ in range(6)]
    assert _wait_until(lambda: sum(c.done() for c in calls) == 2)
    assert server.slots.held("Send", "127.0.0.1") == 4
    assert all(_busy(c.exception()) for c in calls if c.done())
    assert peer_host("ipv6:%5B::1%5D:5123") == "::1" and peer_host("ipv4:10.0.0.7:80") == "10.0.0.7"


def test_a_sender_over_its_in_flight_bound_is_refused_and_others_are_not(net):
    """While the server's main thread is busy, one silo's 17th message is refused RESOURCE_EXHAUSTED
    (busy: the silo's transport retries it), as is a frame that would pass its bytes bound; another
    silo's messages get through, its heartbeats coalesce to one waiting."""
    n = net("token")
    server, inbox = n.server(pump=False, max_frame_bytes=1 << 20)
    send = n.channel(server.address, 1).unary_unary(f"/{SERVICE}/Send")
    busy = 0
    for i in range(MAX_MESSAGES + 4):
        kind = ["heartbeat"] if i == 0 else ({"a": 1} if i == 1 else "result")  # any JSON value
        try:
            send(message_bytes(_msg(kind, 1, i=i)), metadata=n.metadata(1), timeout=10)
        except grpc.RpcError as err:
            assert _busy(err), err
            busy += 1
        assert server.inflight.waiting(1)[0] <= MAX_MESSAGES
    assert busy == 4 and server.inflight.waiting(1)[0] == MAX_MESSAGES
    other = n.channel(server.address, 2).unary_unary(f"/{SERVICE}/Send")
    for _ in range(5):
        other(message_bytes(_msg("heartbeat", 2)), metadata=n.metadata(2), timeout=10)
    other(message_bytes(_msg("result", 2)), metadata=n.metadata(2), timeout=10)
    assert server.inflight.waiting(2)[0] == 2  # one heartbeat and the result
    big = n.channel(server.address, 3).unary_unary(f"/{SERVICE}/Send")
    codes = []
    for _ in range(4):  # 900 kB each: the fourth would pass 2 x 1 MiB + 1 MiB waiting
        try:
            big(message_bytes(_msg("result", 3, pad="x" * 900_000)), metadata=n.metadata(3), timeout=10)
            codes.append("OK")
        except grpc.RpcError as err:
            codes.append(err.code().name if _busy(err) else str(err))
    assert codes == ["OK", "OK", "OK", "RESOURCE_EXHAUSTED"]
    assert server.inflight.waiting(3)[1] <= server.inflight.max_bytes
    silo, _ = n.silo(1, server.address)
    late = threading.Thread(target=silo.send_message, args=(_msg("bye", 1),), daemon=True)
    late.start()  # retries while rank 1 is over its bound
    time.sleep(1.0)
    assert late.is_alive()
    n.pump(server, inbox)
    late.join(timeout=10)
    assert not late.is_alive()
    assert inbox.wait(MAX_MESSAGES + 2 + 3 + 1)
    kinds = [m.get_type() for m in inbox.got if m.get_sender_id() == 2]
    assert kinds == ["heartbeat", "result"]
    assert [m.get_type() for m in inbox.got if m.get_sender_id() == 1][-1] == "bye"


def test_heartbeats_and_ticks_coalesce_in_every_transports_queue():
    queue = QueueTransport(0)
    inbox = Inbox()
    queue.add_observer(inbox)
    for _ in range(5):
        queue.post(_msg("tick", 0, 0))
        assert queue.deliver(message_bytes(_msg("heartbeat", 1))) in ("queued", "coalesced")
    queue.post(_msg("finish", 0, 0))
    thread = threading.Thread(target=queue.handle_receive_message, daemon=True)
    thread.start()
    assert inbox.wait(3)
    queue.stop_receive_message()
    thread.join(timeout=5)
    assert [m.get_type() for m in inbox.got] == ["tick", "heartbeat", "finish"]


def test_an_unauthenticated_flood_leaves_a_bounded_log(net, caplog):
    """20 callers x 50 calls without a valid token: a bounded number of lines (per-source budget and
    summaries that count the rest); a 7 MB refused frame is never logged at its size."""
    caplog.set_level(logging.INFO)
    refusals = RefusalLog(logging.getLogger("fedml_moon.test.flood"), window_s=1.5)
    n = net("token")
    server, _ = n.server(refusals=refusals)
    bad = (("x-fedml-moon-rank", "1"), ("authorization", "Bearer guessed"))
    counts = {"refused": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + 20

    def flood() -> None:
        call = n.channel(server.address, 1).unary_unary(f"/{SERVICE}/Send")
        for _ in range(50):
            if time.monotonic() > deadline:
                return
            with pytest.raises(grpc.RpcError) as err:
                call(b"x" * 100, metadata=bad, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with lock:
                counts["refused"] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=flood, daemon=True) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - start
    assert counts["refused"] == 1000
    said = "refused a call from 127.0.0.1"
    full, summaries = _accounted(caplog, "fedml_moon.test.flood", said, "127.0.0.1", 1000)
    assert len(full) + len(summaries) <= (refusals.per_source + 1) * (elapsed / refusals.window_s + 2)
    assert "bad or missing token (x" in summaries[-1]

    giant = json.dumps({"v": 1, "tree": {"__tensor__": "A" * (7 << 20)}}).encode()  # a 7 MB tensor name
    frame = struct.pack("<4sQ", b"FMC1", len(giant)) + giant
    send = n.channel(server.address, 1).unary_unary(f"/{SERVICE}/Send")
    with pytest.raises(grpc.RpcError) as err:
        send(frame, metadata=n.metadata(1), timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(err.value.details()) < 1000
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("fedml_moon")]
    assert ours and max(len(line) for line in ours) < 1000
    assert sum(len(line) for line in ours) < 200_000


def test_receive_timeout_must_be_positive_and_is_named():
    with pytest.raises(ConfigError, match="comm_args.receive_timeout_s"):
        load_config("config/modes/moon_cross_silo_grpc.yaml", ["comm_args.receive_timeout_s=0"])
    assert load_config("config/modes/moon_cross_silo_grpc.yaml").comm_args.receive_timeout_s == 300.0


def test_mqtt_a_sender_over_its_bound_is_dropped_with_a_bounded_log(tmp_path, monkeypatch, caplog):
    from fedml_moon.distributed.transport.mqtt_s3 import MqttS3Transport, ensure_bucket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    refusals = RefusalLog(logging.getLogger("fedml_moon.test.mqtt"), window_s=1.0)
    with conformance.services(tmp_path) as svc:
        endpoint = f"http://127.0.0.1:{svc.s3_port}"
        ensure_bucket(endpoint, "limits")
        kw = dict(host="127.0.0.1", port=svc.mqtt_port, s3_endpoint=endpoint, bucket="limits", timeout_s=10)
        server = MqttS3Transport(0, "l1", refusals=refusals, **kw)
        silos = [MqttS3Transport(r, "l1", **kw) for r in (1, 2)]
        inbox, thread = Inbox(), None
        try:
            for i in range(MAX_MESSAGES + 30):
                silos[0].send_message(_msg("result", 1, i=i))
            for _ in range(5):
                silos[1].send_message(_msg("heartbeat", 2))
            silos[1].send_message(_msg("result", 2))
            assert _wait_until(lambda: refusals.count == 30 and server.inflight.waiting(2)[0] == 2)
            assert server.inflight.waiting(1)[0] == MAX_MESSAGES
            prefix = "rank 0 dropped a message from rank 1: "
            full, summaries = _accounted(caplog, "fedml_moon.test.mqtt", prefix, "rank 1", 30)
            assert summaries and len(full) + len(summaries) <= 2 * (refusals.per_source + 1)
            assert "16 messages" in full[0] and "at most 16 messages" in full[0]
            server.add_observer(inbox)
            thread = threading.Thread(target=server.handle_receive_message, daemon=True)
            thread.start()
            assert inbox.wait(MAX_MESSAGES + 2)
            time.sleep(0.3)
            assert [m.get("i") for m in inbox.got if m.get_sender_id() == 1] == list(range(MAX_MESSAGES))
            assert [m.get_type() for m in inbox.got if m.get_sender_id() == 2] == ["heartbeat", "result"]
            server.budget = FrameBudget(spare=0)  # a phase in which rank 2 owes one large frame
            server.expect({2: 1})
            for i in range(3):  # through S3: the two past its allowance are deleted unread, undecoded
                silos[1].send_message(_msg("result", 2, i=i, pad="p" * (SMALL_FRAME_BYTES + 1)))
            assert _wait_until(lambda: server.frames[(2, "undecoded")] == 2)
            assert inbox.wait(MAX_MESSAGES + 3)
            assert [m.get("i") for m in inbox.got if m.get_sender_id() == 2] == [None, None, 0]
            assert _wait_until(lambda: server.s3.list_objects_v2(Bucket="limits")["KeyCount"] == 0)
        finally:
            for t in (server, *silos):
                t.stop_receive_message()
            if thread is not None:
                thread.join(timeout=5)


def test_a_silo_outbox_keeps_at_most_its_bound_and_one_heartbeat():
    """Frames for a silo that never subscribes (or is gone for hours): at most 64 wait, the oldest go
    first, past the byte bound too, and heartbeats join the one already waiting."""
    from fedml_moon.distributed.transport.slots import OUTBOX_FRAMES, Lease, Outbox

    outbox = Outbox(max_bytes=1000)
    for i in range(10 * OUTBOX_FRAMES):
        outbox.put(b"beat", heartbeat=True)
        outbox.put(i.to_bytes(4, "big"))
    assert outbox.dropped >= 9 * OUTBOX_FRAMES
    reader, lease = outbox.claim(), Lease(None)
    outbox.close()
    frames = []
    while (frame := outbox.next(reader, lease)) is not None:
        frames.append(frame)
    assert len(frames) == OUTBOX_FRAMES and frames.count(b"beat") <= 1
    assert frames[-1] == (10 * OUTBOX_FRAMES - 1).to_bytes(4, "big")  # the newest stay
    big = Outbox(max_bytes=100)
    for _ in range(5):
        big.put(b"x" * 60)
    assert big.dropped == 4  # past the bytes, one frame of the newest is kept


def test_a_rank_that_churns_subscribe_calls_is_refused_past_its_rate_and_the_others_served(net, caplog):
    """300 Subscribe calls of rank 3 in a row: past its burst (CALL_RATES) they are refused as busy
    before their request is read, the refusals and the "rank 3 subscribed" lines logged within their
    budgets, and the honest silo is served meanwhile."""
    n = net("token")
    server, server_inbox = n.server()
    silo1, inbox1 = n.silo(1, server.address)
    subscribe = n.channel(server.address, 3).stream_stream(f"/{SERVICE}/Subscribe")
    meta = n.metadata(3)
    per_s, burst = server.slots.rates["Subscribe"].per_s, server.slots.rates["Subscribe"].burst
    with caplog.at_level(logging.INFO, logger="fedml_moon.distributed.transport.grpc_transport"):
        started = time.monotonic()
        calls = [subscribe(iter([RANK.pack(3)]), metadata=meta, timeout=10) for _ in range(300)]
        assert _wait_until(lambda: sum(c.done() for c in calls) >= 299)
        elapsed = time.monotonic() - started
        silo1.send_message(_msg("hello", 1))
        server.send_message(_msg("welcome", 0, 1))
        assert server_inbox.wait(1, 5.0) and inbox1.wait(1, 5.0)
        for call in calls:
            call.cancel()
    refused = [c for c in calls if c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
    rate = [c for c in refused if "faster than" in (c.details() or "")]
    assert len(rate) >= 300 - burst - per_s * elapsed - 1 and all(_busy(c) for c in rate[:5])
    assert caplog.text.count("rank 3 subscribed") <= 20
    assert caplog.text.count("starts Subscribe calls faster than") <= 20  # the refusal budget


def test_a_send_the_server_cut_is_sent_again():
    """A Send that ends CANCELLED (a server too busy to read it in time cuts it) is retried, as one
    that found no server; the message arrives once."""
    calls: list[bytes] = []

    def on_send(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        calls.append(next(requests))
        if len(calls) == 1:
            context.abort(grpc.StatusCode.CANCELLED, "cut")
        return b""

    handlers = {"Send": grpc.stream_unary_rpc_method_handler(on_send)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    silo = GrpcClientTransport(1, f"127.0.0.1:{port}", 16, 10)
    try:
        silo.send_message(_msg("hello", 1))
        assert len(calls) == 2 and calls[0] == calls[1]
    finally:
        silo.stop_receive_message()
        server.stop(0)


def test_the_call_rate_is_a_token_bucket_per_caller_by_hand():
    from fedml_moon.distributed.transport.slots import Rate

    now = [0.0]
    rate = Rate(2.0, 3.0, clock=lambda: now[0])
    assert [rate.allow("rank 3") for _ in range(4)] == [True, True, True, False]  # a burst of 3
    now[0] = 0.5  # half a second at 2 a second: one more call
    assert rate.allow("rank 3") and not rate.allow("rank 3")
    assert rate.allow("rank 1")  # each caller its own bucket
    now[0] = 100.0  # idle: full again, never more than the burst
    assert [rate.allow("rank 3") for _ in range(4)] == [True, True, True, False]


def test_room_answers_what_admit_would_before_a_message_is_read_or_decoded():
    """`InFlight.room` (the gRPC server asks it before reading a Send, and again by the frame's size
    before decoding it) agrees with `admit` on the bounds: the first message always fits, then the
    bytes bound, and none past 16 messages."""
    inflight = InFlight(max_frame_bytes=10)  # bytes bound: 2 x 10 + 1 MiB
    assert inflight.room(3, 5_000_000) and inflight.admit(3, None, 5_000_000) == "queued"
    assert not inflight.room(3, 1) and inflight.admit(3, None, 1) == "refused"
    assert inflight.room(4, 0)
    for _ in range(MAX_MESSAGES):
        assert inflight.room(4, 10) and inflight.admit(4, None, 10) == "queued"
    assert not inflight.room(4, 0) and inflight.admit(4, None, 0) == "refused"


def test_a_sender_with_its_16_messages_waiting_is_refused_before_its_request_is_read(net):
    """Rank 1 with 16 messages waiting: its next Send, whose request never arrives, is refused as
    busy naming what waits, not held until the receive timeout cuts it."""
    n = net("token")
    server, _ = n.server(pump=False)
    send = n.channel(server.address, 1).unary_unary(f"/{SERVICE}/Send")
    for i in range(MAX_MESSAGES):
        send(message_bytes(_msg("result", 1, i=i)), metadata=n.metadata(1), timeout=10)
    stream = n.channel(server.address, 1).stream_unary(f"/{SERVICE}/Send")
    with pytest.raises(grpc.RpcError) as refused:
        stream(n.blocked(), metadata=n.metadata(1), timeout=CUT_S + 5)
    assert _busy(refused.value) and "16 messages" in refused.value.details(), refused.value


def test_large_frames_past_a_ranks_phase_allowance_are_refused_undecoded_and_counted(net):
    """Invariant: in a phase, the server decodes at most what a rank owes and SPARE_FRAMES more of its
    frames over SMALL_FRAME_BYTES, whatever they hold; the rest are refused busy before decoding
    (garbage is refused as busy, not as "not a message") and counted, while its small frames, the
    other ranks' frames and, in the next phase, its own are taken. An honest silo's transport
    retries such a refusal and its frame is taken once a phase expects it."""
    n = net("token")
    server, inbox = n.server()
    began = time.monotonic()
    server.expect({3: 1})  # rank 3 owes one upload; ranks 1 and 2 nothing
    big = SMALL_FRAME_BYTES + 1
    send = n.channel(server.address, 3).unary_unary(f"/{SERVICE}/Send")

    def call(frame: bytes) -> str:
        try:
            send(frame, metadata=n.metadata(3), timeout=10)
            return "OK"
        except grpc.RpcError as err:
            return f"busy: {err.details()}" if _busy(err) else f"{err.code().name}: {err.details()}"

    allowed = 1 + SPARE_FRAMES
    answers = [call(message_bytes(_msg("result", 3, i=i, pad="x" * big))) for i in range(allowed)]
    assert answers == ["OK"] * allowed
    hostile = [
        message_bytes(_msg("result", 3, pad="x" * big)),  # one more honest-looking upload
        message_bytes(_msg("result", 1, pad="y" * (3 << 20))),  # another rank's, 3 MB
        os.urandom(big),  # not a message at all
        b"\x00" * (5 << 20),
    ]
    for frame in hostile:
        answer = call(frame)
        assert answer.startswith("busy: a frame of") and "current phase takes" in answer, answer
    assert server.frames[(3, "undecoded")] == len(hostile) and server.frames[(3, "decoded")] == allowed
    assert call(message_bytes(_msg("heartbeat", 3))) == "OK" and call(message_bytes(_msg("bye", 3))) == "OK"
    other = n.channel(server.address, 2).unary_unary(f"/{SERVICE}/Send")
    for i in range(SPARE_FRAMES):  # a rank that owes nothing: its spare frames
        other(message_bytes(_msg("ready", 2, i=i, pad="z" * big)), metadata=n.metadata(2), timeout=10)
    silo, _ = n.silo(1, server.address)
    for i in range(SPARE_FRAMES):
        silo.send_message(_msg("hello", 1, i=i, pad="h" * big))
    late = threading.Thread(target=silo.send_message, args=(_msg("result", 1, pad="r" * big),), daemon=True)
    late.start()  # past rank 1's allowance: refused busy, and sent again by the silo's transport
    assert _wait_until(lambda: server.frames[(1, "undecoded")] >= 1) and late.is_alive()
    server.expect({1: 1, 3: 1})  # the next phase
    late.join(timeout=10)
    assert not late.is_alive() and call(message_bytes(_msg("result", 3, round=1, pad="x" * big))) == "OK"
    assert inbox.wait(allowed + 2 + 2 * SPARE_FRAMES + 2)
    got = [(m.get_sender_id(), m.get_type(), m.get("round")) for m in inbox.got]
    assert [g for g in got if g[0] == 3] == [(3, "result", None)] * allowed + [
        (3, "heartbeat", None),
        (3, "bye", None),
        (3, "result", 1),
    ]
    assert [g[1] for g in got if g[0] == 1] == ["hello"] * SPARE_FRAMES + ["result"]
    assert server.frames[(3, "unread")] == 0 and server.frames[(2, "undecoded")] == 0
    if server.heap.glibc:  # the heap was trimmed after large frames, at most once a second
        assert 1 <= server.heap.trims <= time.monotonic() - began + 1
