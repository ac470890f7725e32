"""MQTT + S3 transport for edge devices: small frames through the broker, large ones through S3.

Each rank subscribes to `fedml_moon/<run_id>/<rank>` (QoS 1, a persistent session so the broker
keeps messages while a device is briefly away). A frame up to `inline_kb` travels in the MQTT message
itself; a larger one is written to the S3 bucket under `<run_id>/<sender>-<receiver>-<uuid>` and only
its key is published; the receiver reads the object (codec bytes: decoded without pickle) and deletes
it. Sends wait until the broker has acknowledged the message, so a last message is not lost when
the process disconnects right after it (FedML's MQTT_S3 loses its FINISHED message that way).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import uuid

from fedml_moon.glue.transport.base import QueueTransport

log = logging.getLogger(__name__)
S3_REF = b"FMS3:"


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
    ) -> None:
        super().__init__(rank)
        import boto3
        import paho.mqtt.client as mqtt

        self.run_id, self.bucket, self.timeout_s = run_id, bucket, timeout_s
        self.inline_bytes = inline_kb * 1024
        self.s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=region or "us-east-1")
        self._connected = threading.Event()
        self._frames: queue.Queue = queue.Queue()
        threading.Thread(target=self._resolve_loop, name=f"mqtt-s3-{rank}", daemon=True).start()
        client_id = f"fedml_moon-{run_id}-{rank}"
        self.client = mqtt.Client(client_id=client_id, clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.connect_async(host, port, keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(timeout_s):
            self.client.loop_stop()
            raise ConnectionError(f"no MQTT broker answered at {host}:{port} within {timeout_s:.0f} s")

    def topic(self, rank: int) -> str:
        return f"fedml_moon/{self.run_id}/{rank}"

    def _on_connect(self, client, userdata, flags, rc) -> None:
        if rc != 0:
            log.error("rank %d: the MQTT broker refused the connection (code %s)", self.rank, rc)
            return
        client.subscribe(self.topic(self.rank), qos=1)
        self._connected.set()

    def _on_message(self, client, userdata, message) -> None:
        self._frames.put(bytes(message.payload))  # S3 reads happen off the MQTT loop, in order

    def _resolve_loop(self) -> None:
        while True:
            payload = self._frames.get()
            if payload is None:
                return
            if payload.startswith(S3_REF):
                payload = self._fetch(payload[len(S3_REF) :].decode("utf-8", errors="replace"))
            if payload is not None:
                self.deliver(payload)

    def _fetch(self, key: str) -> bytes | None:
        try:
            data = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        except Exception as err:  # a missing object or an unreachable store: name it, keep running
            log.error("rank %d could not read s3://%s/%s: %s", self.rank, self.bucket, key, err)
            return None
        return data

    def send_bytes(self, receiver: int, data: bytes) -> None:
        if len(data) > self.inline_bytes:
            key = f"{self.run_id}/{self.rank}-{receiver}-{uuid.uuid4().hex}"
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
            data = S3_REF + key.encode()
        info = self.client.publish(self.topic(receiver), data, qos=1)
        info.wait_for_publish(timeout=self.timeout_s)
        if not info.is_published():
            raise ConnectionError(f"the MQTT broker did not acknowledge a message to rank {receiver}")

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


def s3_credentials_present() -> bool:
    """boto3 reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or its other usual sources)."""
    return bool(os.environ.get("AWS_ACCESS_KEY_ID")) or os.path.exists(
        os.path.expanduser("~/.aws/credentials")
    )
