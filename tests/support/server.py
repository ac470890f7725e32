"""The distributed server manager in the test's own process, on a tiny real run (data, model,
ServerRounds): its transport keeps in memory what it sends, and the tests play the silos' messages
to it. Also a silo's side of such an in-memory network, and the comparison of two runs' outcomes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.adapters.run import build_base, build_server
from fedml_moon.config.load import load_config
from fedml_moon.distributed import managers as m
from fedml_moon.distributed.deploy import _resume_server, buffered_rounds, shared_config
from fedml_moon.distributed.deploy import server_manager as deployed_server_manager
from fedml_moon.distributed.server.manager import ServerManager
from fedml_moon.distributed.transport.base import QueueTransport, message_from_bytes
from tests.support import ROOT

FEDAVG_CONFIG = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
FEDAVGM = [
    "train_args.comm_round=3",
    "train_args.checkpoint_every=1",
    "server_args.server_momentum=0.9",
    "server_args.server_momentum_style=fedavgm",
]
"""Three rounds of FedAvgM (a round applied twice would show in its velocity), a checkpoint after each."""
TIMING = ("round_time_s", "wire_bytes_sent", "wire_bytes_received")
"""A record's fields that differ between two runs of the same rounds."""


class Wire(QueueTransport):
    """The server's side of an in-memory network: every message it sends is kept, decoded."""

    def __init__(self) -> None:
        super().__init__(0)
        self.sent: list[Message] = []

    def send_bytes(self, receiver: int, data: bytes) -> None:
        self.sent.append(message_from_bytes(data))


class SiloWire(QueueTransport):
    """Rank 1's side of an in-memory network: what it sends is kept, with the time it was sent."""

    def __init__(self) -> None:
        super().__init__(1)
        self.sent: list[tuple[float, Message]] = []

    def send_bytes(self, receiver: int, data: bytes) -> None:
        self.sent.append((time.monotonic(), message_from_bytes(data)))


def real_silo(cfg, folder: Path):
    """A real silo manager of rank 1 holding party 0 under `cfg` (its data, model and parties built,
    as its WELCOME would build them), on an in-memory wire that keeps what it sends: (silo, wire, its
    build's base)."""
    from fedml_moon.adapters.run import build_runner, held_claims
    from fedml_moon.distributed.silo.manager import SiloManager
    from fedml_moon.distributed.silo.state import Built, Local

    base = build_base(cfg, folder, 1, role="silo")
    built = Built(build_runner(base), [0], shared_config(cfg), cfg, held_claims(base))
    wire = SiloWire()
    local = Local(shared_config(cfg), [], [0], lambda: [])
    silo = SiloManager(base.args, wire, local, lambda shared: built, 1, cfg.comm_args, folder)
    silo.state.built = built
    return silo, wire, base


def server_manager(
    tmp_path: Path, *extra: str, silos: int = 3, resume: bool = False, secure: bool = True, ready: bool = True
) -> tuple[ServerManager, Wire]:
    """The server manager of a tiny cross-silo run of `silos` silos of one party each (FedAvg, 2 rounds
    unless `extra` says otherwise), every silo having said HELLO and READY (its claims: the server's
    own partition's); with `resume`, from the newest checkpoint in `tmp_path`. `secure=False`: under
    `privacy_args.secure_aggregation` the silos send their uploads and the server runs each secure sum
    itself (the standalone simulation's SecAgg, in one process). `ready=False`: the silos said HELLO
    only, and the run waits for their READY."""
    overrides = [
        *conformance.TINY,
        f"train_args.client_num_in_total={silos}",
        f"train_args.client_num_per_round={silos}",
        "train_args.comm_round=2",
        "common_args.training_type=cross_silo",
        "comm_args.backend=MQTT_S3",
        "validation_args.local_test=false",
        *extra,
    ]
    cfg = load_config(FEDAVG_CONFIG, overrides)
    base = build_base(cfg, tmp_path)
    rounds = build_server(base)
    core = buffered_rounds(cfg, rounds)  # at the parties' real pace: no clock
    start = _resume_server(rounds, tmp_path) if resume else 0
    wire, ranks = Wire(), list(range(1, silos + 1))
    manager = deployed_server_manager(cfg, base.args, wire, rounds, ranks, start, core)
    if not secure and manager.settings.secure:  # the secure sums run in the server, from the uploads
        settings = dataclasses.replace(manager.settings, secure=False)
        manager = ServerManager(base.args, wire, rounds, settings, core)
    manager.register_message_receive_handlers()
    manager.run_config = cfg  # the silos' own copy of the run's config, for tests that play them
    for rank in ranks:
        hello = {"config": shared_config(cfg), "explicit": [], "process": f"p{rank}", "fresh_parties": []}
        receive(manager, rank, m.HELLO, parties=[rank - 1], **hello)
        if ready:
            receive(manager, rank, m.READY, claims=[{"party": rank - 1, "claim": rounds.claims[rank - 1]}])
    return manager, wire


def fedavgm_server(out: Path, resume: bool = False) -> tuple[ServerManager, Wire]:
    """`server_manager` of the three FedAvgM rounds (`FEDAVGM`)."""
    return server_manager(out, *FEDAVGM, resume=resume)


def receive(manager: ServerManager, rank: int, kind: str, /, **params) -> None:
    """The manager receives a message of `kind` from `rank`, with `params` as its fields."""
    msg = Message(kind, rank, 0)
    for key, value in params.items():
        msg.add_params(key, value)
    manager.receive_message(kind, msg)


def restart(manager: ServerManager, rank: int, process: str, parties: list[int]) -> None:
    """Rank `rank` started again as process `process`: its HELLO, then (welcomed, its data built)
    its READY with its parties' claims, as a restarted silo says them."""
    hello = {"config": manager.settings.config, "explicit": [], "fresh_parties": [], "parties": parties}
    receive(manager, rank, m.HELLO, process=process, **hello)
    claims = [{"party": p, "claim": manager.rounds.claims[p]} for p in parties]
    receive(manager, rank, m.READY, claims=claims)


def answer_train(manager: ServerManager, wire: Wire, rank: int) -> None:
    """Rank `rank` answers its TRAIN of the current round with the model it was sent."""
    task = next(
        t
        for t in wire.sent
        if t.get_type() == m.TRAIN
        and t.get_receiver_id() == rank
        and t.get("round") == manager.state.round.round_idx
    )
    results = [result_item(manager, t["party"], t["payload"]["model"]) for t in task.get("tasks")]
    receive(manager, rank, m.RESULT, round=manager.state.round.round_idx, results=results)


def result_item(manager: ServerManager, party: int, model: dict) -> dict:
    """An honest record of a RESULT: the party's fixed sample count, an upload as the spec says."""
    return {"party": party, "n": manager.rounds.samples[party], "upload": {"model": model, "party_id": party}}


def answer_moved(manager: ServerManager, wire: Wire, rank: int, round_idx: int) -> None:
    """Rank `rank`'s RESULT for its TRAIN of `round_idx`: the models it was sent, moved by 0.01 x rank."""
    task = next(
        t
        for t in reversed(wire.sent)
        if t.get_type() == m.TRAIN and t.get_receiver_id() == rank and t.get("round") == round_idx
    )
    results = []
    for t in task.get("tasks"):
        model = {k: v + 0.01 * rank if v.is_floating_point() else v for k, v in t["payload"]["model"].items()}
        upload = {"model": model, "party_id": t["party"]}
        results.append({"party": t["party"], "n": manager.rounds.samples[t["party"]], "upload": upload})
    receive(manager, rank, m.RESULT, round=round_idx, results=results)


def same_tree(a: object, b: object) -> bool:
    """Whether two outcomes (nested dicts of tensors and values) are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
    return a == b
