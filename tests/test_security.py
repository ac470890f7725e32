"""A transport that lets no one in: TLS with the run's CA, silos authenticated by certificate or
token, every refused call logged while the server keeps running; credentials from `fedml-moon certs`."""

from __future__ import annotations

import os
import pickle
import threading
import time

import grpc
import pytest
import torch
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.distributed.transport.base import TransportError, message_bytes
from fedml_moon.distributed.transport.grpc_transport import (
    SERVICE,
    GrpcClientTransport,
    GrpcSecurity,
    GrpcServerTransport,
)
from fedml_moon.distributed.transport.policy import grpc_security
from fedml_moon.security import cert_cap, load_token_caps, load_token_table, make_certs


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder, silos=2, hosts=["127.0.0.1", "localhost"])
    other = tmp_path_factory.mktemp("other-ca")
    make_certs(other, silos=2, hosts=["127.0.0.1"])
    return folder, other


def _sec(folder, name: str, auth: str, **kw) -> GrpcSecurity:
    read = lambda n: (folder / n).read_bytes()  # noqa: E731
    return GrpcSecurity(
        tls=True, ca=read("ca.pem"), cert=read(f"{name}.pem"), key=read(f"{name}.key"), auth=auth, **kw
    )


class Inbox:
    def __init__(self) -> None:
        self.got: list[Message] = []

    def receive_message(self, kind, msg) -> None:
        self.got.append(msg)


def _serve(security: GrpcSecurity, workers: int = 2):
    server = GrpcServerTransport("127.0.0.1", conformance.free_port(), 16, workers, security)
    inbox = Inbox()
    server.add_observer(inbox)
    threading.Thread(target=server.handle_receive_message, daemon=True).start()
    return server, inbox


def _msg(sender: int, receiver: int = 0, **params) -> Message:
    msg = Message("hello", sender, receiver)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


def _wait(inbox: Inbox, n: int) -> None:
    deadline = time.monotonic() + 20
    while len(inbox.got) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def test_certs_command_writes_private_keys_and_token_digests(creds):
    folder, _ = creds
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(
        ["ca.pem", "ca.key", "server.pem", "server.key", "server-tokens.json", "mosquitto.acl", ".gitignore"]
        + [f"silo-{r}.{e}" for r in (1, 2) for e in ("pem", "key", "token")]
        + ["operator.token"]  # reads the status port (tests/test_status_port.py)
    )
    assert all(
        oct((folder / n).stat().st_mode & 0o777) == "0o600" for n in names if n.endswith((".key", ".token"))
    )
    table = load_token_table(folder / "server-tokens.json")
    assert (
        set(table) == {1, 2}
        and (folder / "silo-1.token").read_text() not in (folder / "server-tokens.json").read_text()
        and (folder / "operator.token").read_text() not in (folder / "server-tokens.json").read_text()
    )


def test_mutual_tls_lets_the_silo_in_and_another_cas_certificate_out(creds, caplog):
    folder, other = creds
    server, inbox = _serve(_sec(folder, "server", "mtls"))
    try:
        good = GrpcClientTransport(1, server.address, 16, 20, _sec(folder, "silo-1", "mtls"))
        good.send_message(_msg(1))
        _wait(inbox, 1)
        assert [m.get_sender_id() for m in inbox.got] == [1]
        stranger = GrpcClientTransport(2, server.address, 16, 3, _sec(other, "silo-2", "mtls"))
        # the handshake fails (the CAs differ both ways): the silo retries until its timeout, then says so
        with pytest.raises(TransportError, match="did not take a message within 3 s"):
            stranger.send_message(_msg(2))
        impostor = GrpcClientTransport(2, server.address, 16, 20, _sec(folder, "silo-1", "mtls"))
        with pytest.raises(grpc.RpcError) as err:  # silo 1's certificate cannot speak for rank 2
            impostor.send_message(_msg(2))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        good.send_message(_msg(1, n=2))
        _wait(inbox, 2)
        assert len(inbox.got) == 2  # still serving
        for client in (good, stranger, impostor):
            client.stop_receive_message()
    finally:
        server.stop_receive_message()


def test_forged_calls_are_refused_and_the_server_keeps_running(creds, caplog):
    folder, _ = creds
    tokens = load_token_table(folder / "server-tokens.json")
    server, inbox = _serve(_sec(folder, "server", "token", tokens=tokens))
    token = (folder / "silo-1.token").read_text()
    channel = grpc.secure_channel(
        server.address, grpc.ssl_channel_credentials((folder / "ca.pem").read_bytes())
    )
    send = channel.unary_unary(f"/{SERVICE}/Send")
    subscribe = channel.unary_stream(f"/{SERVICE}/Subscribe")
    auth = (("x-fedml-moon-rank", "1"), ("authorization", f"Bearer {token}"))
    cases = [
        (
            message_bytes(_msg(1)),
            (("x-fedml-moon-rank", "1"), ("authorization", "Bearer wrong")),
            "UNAUTHENTICATED",
        ),
        (message_bytes(_msg(1)), (), "UNAUTHENTICATED"),
        (pickle.dumps({"msg_type": "hello", "sender": 1, "receiver": 0}), auth, "INVALID_ARGUMENT"),
        (os.urandom(2048), auth, "INVALID_ARGUMENT"),
        (message_bytes(_msg(2)), auth, "PERMISSION_DENIED"),  # rank 1's token, rank 2's name
        (message_bytes(_msg(1, receiver=1)), auth, "PERMISSION_DENIED"),
        (message_bytes(_msg(1, big=torch.zeros(5 * 1024 * 1024))), auth, "RESOURCE_EXHAUSTED"),  # > 16 MB
    ]
    try:
        for body, metadata, code in cases:
            with pytest.raises(grpc.RpcError) as err:
                send(body, metadata=metadata, timeout=10)
            assert err.value.code().name == code, (code, err.value.details())
        with pytest.raises(grpc.RpcError) as err:
            list(subscribe((2).to_bytes(8, "little"), metadata=auth, timeout=10))  # rank 1 reading rank 2's
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        send(message_bytes(_msg(1)), metadata=auth, timeout=10)  # the genuine silo still gets through
        _wait(inbox, 1)
        assert [m.get_sender_id() for m in inbox.got] == [1]
        assert caplog.text.count("refused a call from") >= 7
    finally:
        channel.close()
        server.stop_receive_message()


def test_the_token_is_checked_before_the_frame_is_read(creds, caplog):
    """A caller without a valid token cannot make the server take in a frame: with a 1 MB frame limit,
    its 4 MB frame is answered UNAUTHENTICATED (gRPC never read it, or it would say RESOURCE_EXHAUSTED),
    while the genuine silo's oversize frame is RESOURCE_EXHAUSTED and its small message gets through."""
    folder, _ = creds
    tokens = load_token_table(folder / "server-tokens.json")
    security = _sec(folder, "server", "token", tokens=tokens)
    server = GrpcServerTransport("127.0.0.1", conformance.free_port(), 16, 2, security, max_frame_bytes=2**20)
    inbox = Inbox()
    server.add_observer(inbox)
    threading.Thread(target=server.handle_receive_message, daemon=True).start()
    token = (folder / "silo-1.token").read_text()
    channel = grpc.secure_channel(
        server.address, grpc.ssl_channel_credentials((folder / "ca.pem").read_bytes())
    )
    send = channel.unary_unary(f"/{SERVICE}/Send")
    subscribe = channel.unary_stream(f"/{SERVICE}/Subscribe")
    auth = (("x-fedml-moon-rank", "1"), ("authorization", f"Bearer {token}"))
    wrong = (("x-fedml-moon-rank", "1"), ("authorization", "Bearer wrong"))
    oversize = bytes(4 * 2**20)
    try:
        for metadata in (wrong, (), (("x-fedml-moon-rank", "1"),), auth[1:]):
            with pytest.raises(grpc.RpcError) as err:
                send(oversize, metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            list(subscribe((1).to_bytes(8, "little"), metadata=wrong, timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            send(oversize, metadata=auth, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = message_bytes(_msg(1))
        send(small, metadata=auth, timeout=10)
        _wait(inbox, 1)
        assert [m.get_sender_id() for m in inbox.got] == [1]
        assert server.bytes_received == len(small)  # the refused frames were never taken in
        assert caplog.text.count("refused a call from") >= 5
    finally:
        channel.close()
        server.stop_receive_message()


def test_off_loopback_a_run_needs_tls_and_silo_authentication(creds, tmp_path):
    folder, _ = creds
    comm = load_config("config/modes/moon_cross_silo_grpc.yaml").comm_args
    with pytest.raises(
        ConfigError, match="comm_args.tls_ca: needed with TLS; create them with `fedml-moon certs"
    ):
        grpc_security(comm, 1, "10.1.2.3")  # TLS comes on by itself off loopback, and needs the CA
    comm.tls = "off"
    with pytest.raises(ConfigError, match="10.1.2.3 is not a loopback address, so the run needs TLS"):
        grpc_security(comm, 0, "10.1.2.3")
    comm.tls, comm.tls_ca = "auto", str(tmp_path / "missing-ca.pem")
    with pytest.raises(ConfigError, match="comm_args.tls_ca: cannot read .*missing-ca.pem"):
        grpc_security(comm, 1, "10.1.2.3")
    comm.tls_ca, comm.tls_cert, comm.tls_key = (
        str(folder / n) for n in ("ca.pem", "silo-1.pem", "silo-1.key")
    )
    sec = grpc_security(comm, 1, "10.1.2.3")
    assert sec.tls and sec.auth == "mtls" and sec.cert.startswith(b"-----BEGIN CERTIFICATE")
    loop = load_config("config/modes/moon_cross_silo_grpc.yaml").comm_args
    assert grpc_security(loop, 1, "127.0.0.1") == GrpcSecurity()  # loopback development: plain


def test_a_sites_cap_travels_in_its_certificate_and_in_the_token_table(tmp_path):
    """`fedml-moon certs --max-samples 2=500`: the CA signs silo 2's cap into its certificate (the
    gRPC server reads it from the mutual-TLS handshake) and writes it beside silo 2's token digest;
    silo 1 has none (the run's cap holds for it)."""
    make_certs(tmp_path, silos=2, hosts=["127.0.0.1"], caps={2: 500})
    assert cert_cap((tmp_path / "silo-2.pem").read_bytes()) == 500
    assert cert_cap((tmp_path / "silo-1.pem").read_bytes()) is None
    assert load_token_caps(tmp_path / "server-tokens.json") == {2: 500}
    assert set(load_token_table(tmp_path / "server-tokens.json")) == {1, 2}
    server, inbox = _serve(_sec(tmp_path, "server", "mtls"))
    try:
        for rank in (1, 2):
            silo = GrpcClientTransport(rank, server.address, 16, 20, _sec(tmp_path, f"silo-{rank}", "mtls"))
            silo.send_message(_msg(rank))
            _wait(inbox, rank)
            silo.stop_receive_message()
        assert server.caps == {1: None, 2: 500}
    finally:
        server.stop_receive_message()
    with pytest.raises(ValueError, match="RANK in 1..2"):
        make_certs(tmp_path / "bad", silos=2, hosts=["127.0.0.1"], caps={3: 10})
