"""Liveness comes from what a process's transport received, not from when its main thread got to
it: a local round many heartbeat periods long (a plugin whose every step sleeps) raises no alarm in
any transport (no "sent no heartbeat", no second hello, no "is back"), a server that really dies
while its silos train is still noticed (their results find no server within comm_args.timeout_s),
and a silo started before its server says that it waits. Real processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time

import pytest

from fedml_moon import conformance
from fedml_moon.status import record as status
from tests.support.marks import SLOW_WITH_DATA
from tests.support.processes import HEARTBEAT_S, SLOW_STEPS, grpc_command, start_rank, wait_for_text
from tests.support.server import FEDAVG_CONFIG

pytestmark = SLOW_WITH_DATA
SLOW = [*conformance.TINY, *SLOW_STEPS]
FALSE_ALARMS = ("sent no heartbeat", "is back", "stopped sending heartbeats", "welcomed it")


@pytest.mark.parametrize("mode", ["cross-silo-grpc", "mqtt-s3", "cross-silo-mpi"])
def test_a_long_local_round_raises_no_alarm(mode, tmp_path):
    if mode == "mqtt-s3":
        with conformance.services(tmp_path / "services") as svc:
            result = conformance.run_mode(mode, FEDAVG_CONFIG, SLOW, tmp_path, svc, timeout_s=240)
    else:
        result = conformance.run_mode(mode, FEDAVG_CONFIG, SLOW, tmp_path, timeout_s=240)
    assert result.ok, result.tail()
    said = "\n".join(p.read_text(errors="replace") for p in result.logs)
    assert said.count("saying hello to the server") == 3, result.tail()  # once per silo
    for alarm in FALSE_ALARMS:
        assert alarm not in said, f"{alarm!r} in:\n{result.tail(60)}"
    times = [r["round_time_s"] for r in map(json.loads, (result.out_dir / "metrics.jsonl").open())]
    assert min(times) > 10 * HEARTBEAT_S  # the rounds really were many heartbeat periods long


def test_a_server_that_dies_during_a_long_local_round_is_noticed(tmp_path):
    cmd, _ = grpc_command(tmp_path, 2, *SLOW_STEPS, "train_args.comm_round=20", "comm_args.timeout_s=10")
    started = [start_rank(cmd, r, tmp_path) for r in range(3)]
    procs, logs = [proc for proc, _ in started], [log for _, log in started]
    try:
        wait_for_text(logs[0], "round 0:", 120)  # the silos are in their round 1 now: 4 s of steps
        conformance.stop(procs[0], first=signal.SIGKILL)
        killed = time.monotonic()
        codes = conformance.wait_all(procs[1:], 90)
        said = logs[1].read_text(errors="replace")
        # its result finds no server within comm_args.timeout_s (or, idle, its heartbeats stop)
        assert re.search(r"the server cannot be reached|the server \(rank 0\) sent no heartbeat", said), said
        assert codes == [1, 1] and time.monotonic() - killed < 4 + 10 + 15
    finally:
        for proc in procs:
            conformance.stop(proc)


@pytest.mark.parametrize("transport", ["GRPC", "MQTT_S3"])
def test_a_silo_started_before_its_server_says_that_it_waits(transport, tmp_path):
    """It says so every max(5 s, 6 heartbeat periods) and stops at comm_args.timeout_s, naming it;
    its status.json says it never heard from the server."""
    sets = [
        *conformance.TINY,
        "common_args.training_type=cross_silo",
        f"comm_args.backend={transport}",
        "comm_args.heartbeat_s=0.5",  # a line every 5 s (6 periods are less)
        "comm_args.timeout_s=12",
    ]
    log = tmp_path / "rank-1.log"
    with contextlib.ExitStack() as stack:
        if transport == "GRPC":
            ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 4, conformance.free_port())
            sets.append(f"comm_args.grpc_ipconfig_path={ipconfig}")
        else:
            svc = stack.enter_context(conformance.services(tmp_path / "services"))
            sets += [*svc.overrides, f"comm_args.run_id=wait-{conformance.free_port()}"]
        cmd = [*conformance.cli_command("run", FEDAVG_CONFIG, sets, tmp_path / "out"), "--rank", "1"]
        silo = conformance.spawn(cmd, log, conformance.process_env(tmp_path), tmp_path)
        started = time.monotonic()
        (code,) = conformance.wait_all([silo], 90)
    said = log.read_text(errors="replace")
    assert code == 1 and "no answer from the server (rank 0) for 1" in said, said[-2000:]
    assert 11 <= time.monotonic() - started < 60
    waits = [line for line in said.splitlines() if "is waiting for the server (rank 0" in line]
    assert len(waits) >= 2, said[-2000:]  # at 5 s and 10 s
    own = status.read(tmp_path / "out" / "rank-1")  # what `fedml-moon status` shows the site
    assert own["phase"] == "failed" and own["site"] == {"rank": 1, "rounds": 0}
    assert own["server"]["connected"] is False and own["server"]["last_heard_s"] is None


def test_a_pause_renews_only_the_peers_alive_when_it_began():
    """A process paused (stopped, or starved of the CPU) gives its live peers a fresh heartbeat window,
    not a peer that was dead before the pause: however often it is starved, a dead silo stays dead."""
    from types import SimpleNamespace

    from fedml_moon.distributed.managers import _Manager

    now = time.monotonic()
    peer = SimpleNamespace(last_seen={1: now - 9.0, 2: now - 40.0}, heartbeat_s=5.0)
    peer._transport = SimpleNamespace(heard={1: now - 8.0})
    peer.silent_for = lambda rank: _Manager.silent_for(peer, rank)
    # a pause of 8 s: rank 1 was heard 0 s before it began (alive), rank 2 32 s before (dead: > 15 s)
    assert _Manager.alive_before(peer, 8.0) == [1]
