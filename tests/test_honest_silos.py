"""Honest silos are not taken for dead or hostile ones. A silo sends heartbeats from its first HELLO on,
through the building of its data after WELCOME (which on a slow device or a large data set outlasts
three heartbeat periods; before, it sent none until built, and a round that started meanwhile went on
without it). A silo obeys control messages from the server only: in a real run over MQTT + S3
(mosquitto without an ACL and moto on 127.0.0.1, heartbeats every 0.3 s), ABORT, WELCOME and REJOIN
published to silo 1 under silo 2's rank are refused, and the run completes with every party in every
round."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import paho.mqtt.client as mqtt
import pytest
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.config.schema import CommArgs
from fedml_moon.distributed import protocol as p
from fedml_moon.distributed.managers import config_digest
from fedml_moon.distributed.silo.manager import SiloManager
from fedml_moon.distributed.silo.state import Local
from fedml_moon.distributed.transport.base import message_bytes
from tests.support.marks import needs_fmnist
from tests.support.processes import wait_for_text
from tests.support.server import FEDAVG_CONFIG, SiloWire


def test_a_silo_sends_heartbeats_while_it_builds_its_data():
    """The real client manager and its heartbeat thread (every 0.2 s): the server's WELCOME makes it build
    its parties, here a build of 2 s; heartbeats go out all along (about 10), not only once built."""
    wire = SiloWire()
    local = Local(config={}, explicit=[], parties=[0], fresh=lambda: [0])

    def slow_build(shared: dict):
        time.sleep(2.0)
        raise RuntimeError("built enough")  # what it builds does not matter here

    comm = CommArgs(heartbeat_s=0.2)
    manager = SiloManager(SimpleNamespace(), wire, local, slow_build, 1, comm, Path("."))
    manager.hello()
    beats = threading.Thread(target=manager._heartbeat_loop, daemon=True)
    beats.start()
    welcome = Message(p.WELCOME, 0, 1)
    for key, value in {
        "resume_from": None,
        "config": {},
        "config_sha256": config_digest({}),
        "session": "s",
    }.items():
        welcome.add_params(key, value)
    started = time.monotonic()
    with contextlib.suppress(RuntimeError):
        manager.welcome.on_welcome(welcome)
    ended = time.monotonic()
    manager._ticking = False
    beats.join(2)
    during = [t for t, msg in wire.sent if msg.get_type() == p.HEARTBEAT and started <= t <= ended]
    assert ended - started >= 2.0 and len(during) >= 5, len(during)


def _forge(port: int, run_id: str, stop: threading.Event) -> None:
    """Publish, as rank 2 (its own topic: a broker without an ACL lets anyone), control messages to
    rank 1, every half second until `stop`, for at most 60 s."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"forger-{port}", clean_session=True)
    client.connect("127.0.0.1", port)
    client.loop_start()
    forged = [
        (p.ABORT, {"reason": "stop, says rank 2"}),
        (p.REJOIN, {}),
        (
            p.WELCOME,
            {"resume_from": None, "config": {}, "config_sha256": "0" * 64, "session": "forged", "run": None},
        ),
    ]
    deadline = time.monotonic() + 60
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            for kind, params in forged:
                msg = Message(kind, 2, 1)
                for key, value in params.items():
                    msg.add_params(key, value)
                client.publish(f"fedml_moon/{run_id}/to/1/from/2", message_bytes(msg), qos=1)
            stop.wait(0.5)
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.mark.slow
@needs_fmnist
def test_silos_obey_the_server_only_and_quick_heartbeats_cost_no_party(tmp_path: Path):
    with conformance.services(tmp_path / "services") as svc:
        run_id = f"honest-{svc.mqtt_port}"
        settings = [
            *conformance.TINY,
            "train_args.client_num_per_round=3",
            "common_args.training_type=cross_silo",
            "comm_args.backend=MQTT_S3",
            f"comm_args.run_id={run_id}",
            "comm_args.heartbeat_s=0.3",
            "comm_args.timeout_s=90",
            *svc.overrides,
        ]
        out = tmp_path / "out"
        cmd = conformance.cli_command("run", FEDAVG_CONFIG, settings, out)
        env = conformance.process_env(tmp_path)
        logs = [tmp_path / f"rank-{r}.log" for r in range(4)]
        stop = threading.Event()
        forger = threading.Thread(target=_forge, args=(svc.mqtt_port, run_id, stop), daemon=True)
        procs = []
        try:
            for rank in range(3):
                procs.append(conformance.spawn([*cmd, "--rank", str(rank)], logs[rank], env, tmp_path))
            for rank in (1, 2):  # ready before silo 3 says hello: the round starts while it builds
                wait_for_text(logs[rank], f"rank {rank} holds parties", 120)
            procs.append(conformance.spawn([*cmd, "--rank", "3"], logs[3], env, tmp_path))
            forger.start()
            codes = conformance.wait_all(procs, 240)
        finally:
            stop.set()
            for proc in procs:
                conformance.stop(proc)
            forger.join(5)
    text = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0, 0, 0], (codes, "\n".join(t[-1500:] for t in text))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["parties"] == 3 and "missing_parties" not in r for r in records)
    assert "stopped sending heartbeats" not in text[0]
    for kind in ("abort", "rejoin", "welcome"):
        assert (
            f"rank 1 refused a {kind} message from rank 2: rank 1 takes messages from the server" in text[1]
        )
    assert "the server stopped the run" not in text[1]
