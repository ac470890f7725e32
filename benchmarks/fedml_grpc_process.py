"""One process of a cross-silo gRPC run whose managers talk through FedML 0.9.6's own gRPC transport
(plain, pickled, polling), for `benchmarks/transport_cost.py` only. Usage: as `fedml-moon run ...`.

FedML's GRPCCommManager has every node listen on its ipconfig row and cannot wait for a peer that is
not up yet, so the benchmark starts the server first. Bytes are counted where FedML pickles a message
(sent) and where its servicer queues one (received).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from typing import Any

# FedML's generated gRPC code predates protobuf 4: it loads with protobuf's Python implementation
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

from fedml_moon.distributed import deploy


class _CountingPickle:
    def __init__(self, counter: dict) -> None:
        self.counter = counter

    def dumps(self, obj: Any) -> bytes:
        data = pickle.dumps(obj)
        self.counter["sent"] += len(data)
        return data

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class _ProtocolFields:
    """FedML's gRPC adds its sender's address to every message it delivers; the plugin's managers take
    the protocol's fields only (protocol.py), as its own transports deliver them."""

    ADDED = ("sender_rank", "sender_ip", "sender_port")

    def __init__(self, observer: Any) -> None:
        self.observer = observer

    def receive_message(self, msg_type: Any, msg: Any) -> None:
        for key in self.ADDED:
            msg.get_params().pop(key, None)
        self.observer.receive_message(msg_type, msg)


class FedmlGrpcTransport:
    """FedML's GRPCCommManager behind the interface the plugin's managers use."""

    def __init__(self, ipconfig: str, rank: int, workers: int) -> None:
        from fedml.core.distributed.communication.grpc import grpc_comm_manager

        self.counter = {"sent": 0, "received": 0}
        grpc_comm_manager.pickle = _CountingPickle(self.counter)
        self.inner = grpc_comm_manager.GRPCCommManager(ipconfig, client_rank=rank, client_num=max(workers, 1))
        queue = self.inner.grpc_servicer.message_q
        put = queue.put

        def counting_put(item, *args, **kwargs):
            self.counter["received"] += len(item)
            return put(item, *args, **kwargs)

        queue.put = counting_put
        self.running = True

    @property
    def bytes_sent(self) -> int:
        return self.counter["sent"]

    @property
    def bytes_received(self) -> int:
        return self.counter["received"]

    def add_observer(self, observer: Any) -> None:
        self.inner.add_observer(_ProtocolFields(observer))

    def send_message(self, msg: Any) -> None:
        self.inner.send_message(msg)

    def post(self, msg: Any) -> None:
        self.inner.grpc_servicer.message_q.put(pickle.dumps(msg))

    def handle_receive_message(self) -> None:
        self.inner.handle_receive_message()

    def stop_receive_message(self) -> None:
        self.running = False
        self.inner.stop_receive_message()


def _fedml_transport(
    cfg: Any, rank: int, workers: int, comm: Any = None, max_frame_bytes: int | None = None
) -> FedmlGrpcTransport:
    """`deploy.make_transport`'s signature (FedML's transport has no frame limit of its own)."""
    return FedmlGrpcTransport(cfg.comm_args.grpc_ipconfig_path, rank, workers)


def _quiet_fedml(setup):
    """FedML logs every message it sends (payload included) on the root logger: keep ours only."""

    def wrapped(*args, **kwargs):
        setup(*args, **kwargs)
        logging.getLogger("fedml_moon").setLevel(logging.INFO)
        logging.getLogger().setLevel(logging.WARNING)

    return wrapped


if __name__ == "__main__":
    deploy.make_transport = _fedml_transport
    from fedml_moon import cli
    from fedml_moon.cli import train

    cli.setup_logging = train.setup_logging = _quiet_fedml(train.setup_logging)
    sys.exit(cli.main(sys.argv[1:]))
