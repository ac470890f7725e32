"""What every transport shares: Message <-> bytes, and a receive queue the main thread blocks on."""

from __future__ import annotations

import logging
import queue
from typing import Any

from fedml.core.distributed.communication.base_com_manager import BaseCommunicationManager
from fedml.core.distributed.communication.message import Message

from fedml_moon.core.codec import CodecError, decode, encode

log = logging.getLogger(__name__)
_STOP = object()


class TransportError(ConnectionError):
    """A peer cannot be reached within the transport's time limit (the message was not delivered)."""


def message_bytes(msg: Message) -> bytes:
    """A FedML Message as codec bytes (its params: type, sender, receiver and payload trees)."""
    return encode(dict(msg.get_params()))


def message_from_bytes(data: bytes) -> Message:
    """The Message in `data`; CodecError when it is not one."""
    params = decode(data)
    if not isinstance(params, dict) or not {"msg_type", "sender", "receiver"} <= set(params):
        raise CodecError("not a message: msg_type, sender and receiver are required")
    sender, receiver = params["sender"], params["receiver"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (sender, receiver)):
        raise CodecError("sender and receiver must be integer ranks")
    msg = Message(params["msg_type"], sender, receiver)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


class QueueTransport(BaseCommunicationManager):
    """Base of the plugin's transports. Receive threads call `deliver(bytes)`; the FedML manager's
    `run()` calls `handle_receive_message()`, which blocks on a queue and hands each message to the
    observers in the calling thread, until `stop_receive_message()`."""

    def __init__(self, rank: int) -> None:
        self.rank = int(rank)
        self._observers: list[Any] = []
        self._inbox: queue.Queue = queue.Queue()
        self.running = True
        self.bytes_sent = 0  # encoded message bytes this process sent / received (the wire payload)
        self.bytes_received = 0

    def add_observer(self, observer: Any) -> None:
        self._observers.append(observer)

    def remove_observer(self, observer: Any) -> None:
        self._observers.remove(observer)

    def send_message(self, msg: Message) -> None:
        data = message_bytes(msg)
        self.send_bytes(int(msg.get_receiver_id()), data)
        self.bytes_sent += len(data)

    def send_bytes(self, receiver: int, data: bytes) -> None:
        raise NotImplementedError

    def deliver(self, data: bytes) -> None:
        """Decode received bytes and queue the message; malformed bytes are logged and dropped."""
        self.bytes_received += len(data)
        try:
            msg = message_from_bytes(data)
        except CodecError as err:
            log.warning("rank %d dropped a malformed message (%d bytes): %s", self.rank, len(data), err)
            return
        self._inbox.put(msg)

    def post(self, msg: Message) -> None:
        """Queue a message from this process itself (timers, watchdogs) for the main thread."""
        self._inbox.put(msg)

    def handle_receive_message(self) -> None:
        while True:
            msg = self._inbox.get()
            if msg is _STOP:
                return
            for observer in list(self._observers):
                observer.receive_message(msg.get_type(), msg)

    def stop_receive_message(self) -> None:
        self.running = False
        self._inbox.put(_STOP)
        self.close()

    def close(self) -> None:
        """Release sockets and threads (transport-specific)."""
