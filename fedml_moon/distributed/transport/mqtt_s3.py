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
stops the receive thread: every failure is logged and the message dropped. Sends wait until the
broker has acknowledged the message, so a last message is not lost when
the process disconnects right after it (FedML's MQTT_S3 loses its FINISHED message that way).
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from dataclasses import dataclass

from fedml_moon.core.codec import CodecError
from fedml_moon.distributed.transport.base import QueueTransport, TransportError, message_from_bytes

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
    ) -> None:
        super().__init__(rank)
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
        self.client = mqtt.Client(client_id=client_id, clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        sec = security or MqttSecurity()
        if sec.tls:
            self.client.tls_set(ca_certs=sec.ca, certfile=sec.cert, keyfile=sec.key)
        if sec.username:
            self.client.username_pw_set(sec.username, sec.password)
        self._refused: int | None = None
        self.client.connect_async(host, port, keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(timeout_s) or self._refused is not None:
            self.client.loop_stop()
            why = (
                f"refused the connection (code {self._refused}: wrong user or password?)"
                if self._refused
                else "did not answer"
            )
            raise ConnectionError(f"the MQTT broker at {host}:{port} {why} within {timeout_s:.0f} s")

    def topic(self, receiver: int, sender: int | str) -> str:
        return f"fedml_moon/{self.run_id}/to/{receiver}/from/{sender}"

    def _on_connect(self, client, userdata, flags, rc) -> None:
        if rc != 0:
            log.error("rank %d: the MQTT broker refused the connection (code %s)", self.rank, rc)
            self._refused = rc
            self._connected.set()
            return
        client.subscribe(self.topic(self.rank, "+"), qos=1)
        self._connected.set()

    def _on_message(self, client, userdata, message) -> None:
        try:
            sender = message.topic.rsplit("/", 1)[-1]
            self._frames.put((sender, bytes(message.payload)))  # S3 reads happen off the MQTT loop, in order
        except Exception:  # paho's loop thread must survive anything
            log.exception("rank %d dropped an MQTT message", self.rank)

    def _resolve_loop(self) -> None:
        while True:
            item = self._frames.get()
            if item is None:
                return
            sender, payload = item
            try:
                if payload.startswith(S3_REF):
                    payload = self._fetch(sender, payload[len(S3_REF) :].decode("utf-8", errors="replace"))
                elif len(payload) > self.max_frame_bytes:
                    log.warning(
                        "rank %d dropped an inline frame of %d bytes from/%s (over %d)",
                        self.rank,
                        len(payload),
                        sender,
                        self.max_frame_bytes,
                    )
                    payload = None
                if payload is not None:
                    self._deliver_from(sender, payload)
            except Exception:  # nothing a peer sends may stop this thread
                log.exception("rank %d dropped a message from/%s", self.rank, sender)

    def _deliver_from(self, sender: str, payload: bytes) -> None:
        """Queue the message if it is one and its sender is the one its topic names."""
        self.bytes_received += len(payload)
        try:
            msg = message_from_bytes(payload)
        except CodecError as err:
            log.warning("rank %d dropped a malformed message on from/%s: %s", self.rank, sender, err)
            return
        if str(msg.get_sender_id()) != sender or msg.get_receiver_id() != self.rank:
            log.warning(
                "rank %d dropped a message claiming rank %s on from/%s",
                self.rank,
                msg.get_sender_id(),
                sender,
            )
            return
        self._inbox.put(msg)

    def _fetch(self, sender: str, key: str) -> bytes | None:
        """The object `key`, if the topic's sender wrote it for this rank and it is not too large."""
        run, _, name = key.partition("/")
        parts = name.split("-")
        if run != self.run_id or len(parts) != 3 or parts[0] != sender or parts[1] != str(self.rank):
            log.warning(
                "rank %d refused S3 key %r on from/%s: not this run's, the sender's, for it",
                self.rank,
                key[:200],
                sender,
            )
            return None
        try:
            size = int(self.s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
            if size > self.max_frame_bytes:
                log.warning(
                    "rank %d refused s3://%s/%s: %d bytes, over the limit of %d",
                    self.rank,
                    self.bucket,
                    key,
                    size,
                    self.max_frame_bytes,
                )
                self.s3.delete_object(Bucket=self.bucket, Key=key)
                return None
            data = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read(self.max_frame_bytes + 1)
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        except Exception as err:  # a missing object or an unreachable store: name it, keep running
            log.error("rank %d could not read s3://%s/%s: %s", self.rank, self.bucket, key, err)
            return None
        if len(data) > self.max_frame_bytes:
            log.warning(
                "rank %d refused s3://%s/%s: over the limit of %d bytes",
                self.rank,
                self.bucket,
                key,
                self.max_frame_bytes,
            )
            return None
        return data

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
