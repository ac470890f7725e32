"""MQTT + S3 transport for edge devices: small frames through the broker, large ones through S3.

A message from rank s to rank r travels on `fedml_moon/<run_id>/to/<r>/from/<s>`; each rank subscribes
to `fedml_moon/<run_id>/to/<rank>/from/+` (QoS 1, a persistent session so the broker keeps messages
while a device is briefly away) and drops any message whose sender differs from its topic's, so a
broker ACL that lets each user publish only under its own `from/<rank>` (`fedml-moon certs` writes
one) binds every message to an authenticated sender. With `MqttSecurity`: TLS to the broker
(verified against the CA; optionally a client certificate) and a username and password.
A frame up to `inline_kb` travels in the MQTT message
itself; a larger one is written to the S3 bucket under `<run_id>/<sender>-<receiver>-<uuid>` and only
its key is published; the receiver reads the object (codec bytes: decoded without pickle) and deletes
it. A key names its sender and receiver (`<run_id>/<sender>-<receiver>-<uuid>`): a receiver fetches
only keys of its run addressed to itself by the sender the topic names (so a silo cannot make the
server read or delete another silo's objects), and asks the object's size first (S3 HEAD): one over
`max_frame_bytes` is refused unread (and an inline frame over it dropped). Nothing a peer sends
stops the receive thread: every failure is logged (bounded, rate-limited per sender) and the message
dropped. Sends wait until the broker has acknowledged the message, so a last message is not lost when
the process disconnects right after it (FedML's MQTT_S3 loses its FINISHED message that way).

A message counts against its sender's in-flight bound (`inflight`: 16 messages, 2 x max_frame_bytes
+ 1 MiB) from its arrival until the main thread takes it: an inline frame is decoded and checked in
paho's thread as it arrives, an S3 reference counts by its key until the object's size (HEAD) is
known; a message past the bound is dropped with a warning, an object past it is deleted unread. The
resolve thread hands the messages to the inbox in the order they arrived, reading those in S3.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.core.codec import CodecError
from fedml_moon.distributed.transport.base import QueueTransport, TransportError, message_from_bytes
from fedml_moon.distributed.transport.inflight import QUEUED, REFUSED, Waiting, coalesced_kind
from fedml_moon.status.refusals import RefusalLog, bounded

log = logging.getLogger(__name__)
S3_REF = b"FMS3:"


@dataclass
class MqttSecurity:
    tls: bool = False
    ca: str | None = None  # paths: paho reads the files
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = None


class MqttS3Transport(QueueTransport):
    def __init__(
        self,
        rank: int,
        run_id: str,
        *,
        host: str,
        port: int,
        s3_endpoint: str | None,
        bucket: str,
        region: str | None = None,
        inline_kb: int = 64,
        timeout_s: float = 60.0,
        security: MqttSecurity | None = None,
        max_frame_bytes: int = 1 << 30,
        refusals: RefusalLog | None = None,
    ) -> None:
        super().__init__(rank, max_frame_bytes, refusals)
        import boto3
        import paho.mqtt.client as mqtt

        self.run_id, self.bucket, self.timeout_s = run_id, bucket, timeout_s
        self.inline_bytes = inline_kb * 1024
        self.max_frame_bytes = int(max_frame_bytes)
        self.s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=region or "us-east-1")
        self._connected = threading.Event()
        self._frames: queue.Queue = queue.Queue()
        threading.Thread(target=self._resolve_loop, name=f"mqtt-s3-{rank}", daemon=True).start()
        client_id = f"fedml_moon-{run_id}-{rank}"
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        sec = security or MqttSecurity()
        if sec.tls:
            self.client.tls_set(ca_certs=sec.ca, certfile=sec.cert, keyfile=sec.key)
        if sec.username:
            self.client.username_pw_set(sec.username, sec.password)
        self._refused: Any = None  # the broker's reason code when it refused
        self.client.connect_async(host, port, keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(timeout_s) or self._refused is not None:
            self.client.loop_stop()
            why = (
                f"refused the connection ({self._refused}: wrong user or password?)"
                if self._refused
                else "did not answer"
            )
            raise ConnectionError(f"the MQTT broker at {host}:{port} {why} within {timeout_s:.0f} s")

    def topic(self, receiver: int, sender: int | str) -> str:
        return f"fedml_moon/{self.run_id}/to/{receiver}/from/{sender}"

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        if reason.is_failure:  # paho-mqtt 2's callbacks (CallbackAPIVersion.VERSION2)
            log.error("rank %d: the MQTT broker refused the connection (%s)", self.rank, reason)
            self._refused = reason
            self._connected.set()
            return
        client.subscribe(self.topic(self.rank, "+"), qos=1)
        self._connected.set()

    def _on_message(self, client, userdata, message) -> None:
        try:
            self._arrive(message.topic.rsplit("/", 1)[-1], bytes(message.payload))
        except Exception as err:  # paho's loop thread must survive anything
            self.refuse("mqtt", f"rank {self.rank} dropped an MQTT message: {type(err).__name__}: {err}")

    def _arrive(self, topic_sender: str, payload: bytes) -> None:
        """In paho's thread: count the message against its sender (an inline frame decoded and
        checked now, an S3 reference by its key) and queue it, in order, for the resolve thread."""
        if not (topic_sender.isascii() and topic_sender.isdigit() and str(int(topic_sender)) == topic_sender):
            what = f"rank {self.rank} dropped a message on from/{bounded(topic_sender, 40)}: not a rank"
            self.refuse("from/?", what, "not a rank")
            return
        sender, source = int(topic_sender), f"rank {topic_sender}"
        entry = Waiting(None, sender, None, len(payload))
        if not payload.startswith(S3_REF):
            if len(payload) <= self.max_frame_bytes and not self.within_budget(sender, len(payload), source):
                return
            entry.msg = self._message(sender, payload, source)
            if entry.msg is None:
                return
            entry.kind = coalesced_kind(entry.msg.get_type())
        verdict = self.inflight.admit(sender, entry.kind, entry.size)
        if verdict != REFUSED:
            self.heard_from(sender)  # its topic names it, and the broker's ACL lets only it publish there
        if verdict == REFUSED:
            self.refuse_busy(source, sender)
        elif verdict == QUEUED:
            self._frames.put((entry, None if entry.msg is not None else payload[len(S3_REF) :]))

    def _message(self, sender: int, payload: bytes, source: str) -> Message | None:
        """The message in `payload` if it is one, not too large, from the sender its topic names."""
        if len(payload) > self.max_frame_bytes:
            what = (
                f"rank {self.rank} dropped an inline frame of {len(payload)} bytes from/{sender} "
                f"(over {self.max_frame_bytes})"
            )
            self.refuse(source, what, "frame too large")
            return None
        self.bytes_received += len(payload)
        self.count_frame(sender, "decoded")
        try:
            msg = message_from_bytes(payload)
        except CodecError as err:
            what = f"rank {self.rank} dropped a malformed message on from/{sender}: {err}"
            self.refuse(source, what, "a malformed message")
            return None
        if msg.get_sender_id() != sender or msg.get_receiver_id() != self.rank:
            what = f"rank {self.rank} dropped a message claiming rank {msg.get_sender_id()} on from/{sender}"
            self.refuse(source, f"{what} to rank {msg.get_receiver_id()}", "claims another rank")
            return None
        return msg

    def _resolve_loop(self) -> None:
        """Hands the queued messages to the inbox in order, reading those that travel through S3."""
        while True:
            item = self._frames.get()
            if item is None:
                return
            entry, ref = item
            try:
                if ref is not None:
                    entry.msg = self._resolve(entry, ref.decode("utf-8", errors="replace"))
            except Exception as err:  # nothing a peer sends may stop this thread
                self.refuse(f"rank {entry.sender}", f"rank {self.rank} dropped a message: {err}")
                entry.msg = None
            if entry.msg is None:
                self.inflight.release(entry.sender, entry.kind, entry.size)
            else:
                self._inbox.put(entry)

    def _resolve(self, entry: Waiting, key: str) -> Message | None:
        """The message behind S3 key `key` (its bytes now counted against its sender), or None."""
        data = self._fetch(entry, key)
        return None if data is None else self._message(entry.sender, data, f"rank {entry.sender}")

    def _fetch(self, entry: Waiting, key: str) -> bytes | None:
        """The object `key`, if the topic's sender wrote it for this rank, it is not too large, and
        its sender has room for it in flight (asked with HEAD: a refused object is never read)."""
        sender, source = str(entry.sender), f"rank {entry.sender}"
        run, _, name = key.partition("/")
        parts = name.split("-")
        if run != self.run_id or len(parts) != 3 or parts[0] != sender or parts[1] != str(self.rank):
            what = (
                f"rank {self.rank} refused S3 key {key[:200]!r} on from/{sender}: "
                "not this run's, the sender's, for it"
            )
            self.refuse(source, what, "not the sender's S3 key")
            return None
        where = f"s3://{self.bucket}/{bounded(key, 200)}"
        try:
            size = int(self.s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
            if not self._room(entry, size, where):
                self.s3.delete_object(Bucket=self.bucket, Key=key)
                return None
            data = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read(self.max_frame_bytes + 1)
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        except Exception as err:  # a missing object or an unreachable store: name it, keep running
            self.refuse(source, f"rank {self.rank} could not read {where}: {err}", "S3 read failed")
            return None
        if len(data) > self.max_frame_bytes:
            what = f"rank {self.rank} refused {where}: over the limit of {self.max_frame_bytes} bytes"
            self.refuse(source, what, "S3 object refused")
            return None
        return data

    def _room(self, entry: Waiting, size: int, where: str) -> bool:
        """Count an S3 object of `size` bytes against its sender; False (logged) when it is over the
        frame limit, the sender's in-flight bound or the large frames its phase takes."""
        source = f"rank {entry.sender}"
        if size <= self.max_frame_bytes and not self.within_budget(entry.sender, size, source):
            return False
        if size <= self.max_frame_bytes and self.inflight.grow(entry.sender, size):
            entry.size += size
            return True
        why = (
            f"over the limit of {self.max_frame_bytes}"
            if size > self.max_frame_bytes
            else self.inflight.describe(entry.sender)
        )
        what = f"rank {self.rank} refused {where}: {size} bytes, {why}"
        self.refuse(f"rank {entry.sender}", what, "S3 object refused")
        return False

    def send_bytes(self, receiver: int, data: bytes) -> None:
        if len(data) > self.inline_bytes:
            key = f"{self.run_id}/{self.rank}-{receiver}-{uuid.uuid4().hex}"
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
            data = S3_REF + key.encode()
        info = self.client.publish(self.topic(receiver, self.rank), data, qos=1)
        info.wait_for_publish(timeout=self.timeout_s)
        if not info.is_published():
            raise TransportError(f"the MQTT broker did not acknowledge a message to rank {receiver}")

    def close(self) -> None:
        self._frames.put(None)
        self.client.disconnect()
        self.client.loop_stop()


def ensure_bucket(endpoint: str | None, bucket: str, region: str | None = None) -> None:
    """Create the bucket when it does not exist (the server does this at start)."""
    import boto3
    from botocore.exceptions import ClientError

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1")
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError:
        s3.create_bucket(Bucket=bucket)
        log.info("created bucket %s at %s", bucket, endpoint or "AWS")
