"""MQTT + S3 with the same rules: TLS to a real mosquitto (our CA), a user and password per rank, an
ACL that lets each user publish only as itself, and receivers that drop a message whose sender is not
the one its topic names."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
import torch
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.distributed.transport.base import message_bytes
from fedml_moon.distributed.transport.mqtt_s3 import S3_REF, MqttS3Transport, MqttSecurity, ensure_bucket
from fedml_moon.security import make_certs
from tests.support.hostile import huge_int_frame

pytestmark = pytest.mark.slow


class Inbox:
    def __init__(self) -> None:
        self.got: list[Message] = []

    def receive_message(self, kind, msg) -> None:
        self.got.append(msg)


@pytest.fixture
def secure_broker(tmp_path, monkeypatch):
    """mosquitto with TLS, passwords (the silos' tokens) and the ACL `fedml-moon certs` writes."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    certs = tmp_path / "certs"
    make_certs(certs, silos=2, hosts=["127.0.0.1"])
    passwords = {
        "server": "server-password",
        **{f"silo-{r}": (certs / f"silo-{r}.token").read_text() for r in (1, 2)},
    }
    pwfile = tmp_path / "passwd"
    for i, (user, password) in enumerate(passwords.items()):
        flags = ["-c"] if i == 0 else []
        subprocess.run(
            ["mosquitto_passwd", *flags, "-b", str(pwfile), user, password], check=True, capture_output=True
        )
    broker = f"user root\nallow_anonymous false\npassword_file {pwfile}\nacl_file {certs / 'mosquitto.acl'}"
    listener = f"cafile {certs / 'ca.pem'}\ncertfile {certs / 'server.pem'}\nkeyfile {certs / 'server.key'}"
    with conformance.services(tmp_path / "services", broker, listener) as svc:
        port, endpoint = svc.mqtt_port, f"http://127.0.0.1:{svc.s3_port}"
        ensure_bucket(endpoint, "sec")

        def connect(rank: int, password: str | None = None, **kw) -> MqttS3Transport:
            user = "server" if rank == 0 else f"silo-{rank}"
            sec = MqttSecurity(
                tls=True, ca=str(certs / "ca.pem"), username=user, password=password or passwords[user]
            )
            return MqttS3Transport(
                rank,
                "sec1",
                host="127.0.0.1",
                port=port,
                s3_endpoint=endpoint,
                bucket="sec",
                timeout_s=10,
                security=sec,
                **kw,
            )

        yield connect


def _msg(sender: int, receiver: int = 0, **params) -> Message:
    msg = Message("result", sender, receiver)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


def test_tls_users_and_acl_bind_every_message_to_its_sender(secure_broker, caplog):
    server, silo1, silo2 = secure_broker(0), secure_broker(1), secure_broker(2)
    inbox = Inbox()
    server.add_observer(inbox)
    threading.Thread(target=server.handle_receive_message, daemon=True).start()
    try:
        silo1.send_message(_msg(1, w=torch.ones(3)))
        # silo 2 publishes under silo 1's name: the broker's ACL drops it
        silo2.client.publish(
            "fedml_moon/sec1/to/0/from/1", message_bytes(_msg(1, forged=1)), qos=1
        ).wait_for_publish(5)
        # silo 2 publishes as itself a message that claims to be silo 1's: the server drops it
        silo2.client.publish(
            "fedml_moon/sec1/to/0/from/2", message_bytes(_msg(1, forged=2)), qos=1
        ).wait_for_publish(5)
        silo2.send_message(_msg(2, n=2))
        deadline = time.monotonic() + 15
        while len(inbox.got) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert [(m.get_sender_id(), m.get("forged")) for m in inbox.got] == [(1, None), (2, None)]
        assert "dropped a message claiming rank 1 on from/2" in caplog.text
        with pytest.raises(ConnectionError, match="refused the connection"):
            secure_broker(1, password="not-the-token")
    finally:
        for t in (server, silo1, silo2):
            t.stop_receive_message()


def test_a_silo_cannot_touch_another_silos_objects_nor_stop_or_flood_the_receive_thread(
    secure_broker, caplog
):
    """Refused before anything is read: an S3 key of another silo (the object stays), an object over
    the size limit (asked with HEAD), a frame whose JSON holds a 5,000-digit integer; the server's
    receive thread then still delivers the next honest message."""
    server, silo1, silo2 = secure_broker(0, max_frame_bytes=1 << 20), secure_broker(1), secure_broker(2)
    inbox = Inbox()
    server.add_observer(inbox)
    threading.Thread(target=server.handle_receive_message, daemon=True).start()
    try:
        theirs = "sec1/2-0-" + "a" * 32  # silo 2's upload to the server, waiting in the bucket
        silo2.s3.put_object(Bucket="sec", Key=theirs, Body=message_bytes(_msg(2, n=2)))
        publish = silo1.client.publish
        publish("fedml_moon/sec1/to/0/from/1", S3_REF + theirs.encode(), qos=1).wait_for_publish(5)
        big = "sec1/1-0-" + "b" * 32
        silo1.s3.put_object(Bucket="sec", Key=big, Body=b"x" * (2 << 20))
        publish("fedml_moon/sec1/to/0/from/1", S3_REF + big.encode(), qos=1).wait_for_publish(5)
        digits = huge_int_frame()
        publish("fedml_moon/sec1/to/0/from/1", digits, qos=1).wait_for_publish(5)
        silo1.send_message(_msg(1, n=1))
        deadline = time.monotonic() + 15
        while not inbox.got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(m.get_sender_id(), m.get("n")) for m in inbox.got] == [(1, 1)]
        assert silo2.s3.head_object(Bucket="sec", Key=theirs)["ContentLength"] > 0  # neither read nor deleted
        assert "refused S3 key 'sec1/2-0-" in caplog.text
        assert "over the limit of 1048576" in caplog.text
        assert "dropped a malformed message on from/1" in caplog.text
    finally:
        for t in (server, silo1, silo2):
            t.stop_receive_message()
