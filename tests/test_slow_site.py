"""`device_args.delay_per_round_s`: a site's own setting that makes a real silo as slow as a slower
machine (to try buffered aggregation's straggler handling on one machine): it waits that long after
each local round it trains, before it answers; the server's value never reaches a silo, and the
standalone simulation, which keeps time on its simulated clock, refuses it."""

from __future__ import annotations

import json
import time

import pytest
from fedml.core.distributed.communication.message import Message

from fedml_moon import conformance
from fedml_moon.adapters.run import build_base, build_server
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.distributed import protocol
from fedml_moon.distributed.deploy import shared_config
from fedml_moon.distributed.silo.manager import SiloManager
from tests.support.marks import needs_fmnist
from tests.support.processes import grpc_command, start_rank
from tests.support.server import FEDAVG_CONFIG, SiloWire, real_silo

RUN = [*conformance.TINY, "common_args.training_type=cross_silo", "comm_args.backend=MQTT_S3"]
DELAY_S = 0.6


def test_the_delay_is_a_sites_own_and_checked():
    cfg = load_config(FEDAVG_CONFIG, [*RUN, f"device_args.delay_per_round_s={DELAY_S}"])
    assert cfg.device_args.delay_per_round_s == DELAY_S
    assert not any(key.startswith("device_args") for key in shared_config(cfg))  # never sent to a silo
    for value in (-1, "slow", True, 1e9):
        with pytest.raises(ConfigError, match="device_args.delay_per_round_s"):
            load_config(FEDAVG_CONFIG, [*RUN, f"device_args.delay_per_round_s={value}"])
    with pytest.raises(ConfigError, match="device_args.delay_per_round_s: slows a silo of a distributed run"):
        load_config(FEDAVG_CONFIG, [*conformance.TINY, "device_args.delay_per_round_s=1"])


def _silo(tmp_path, delay: float) -> tuple[SiloManager, SiloWire, dict]:
    """A real silo of party 0 (its data, model and parties built), and a TRAIN's task for it."""
    cfg = load_config(FEDAVG_CONFIG, [*RUN, f"device_args.delay_per_round_s={delay}"])
    silo, wire, _ = real_silo(cfg, tmp_path / f"silo-{delay}")
    task = {
        "party": 0,
        "payload": next(
            iter(build_server(build_base(cfg, tmp_path / f"server-{delay}")).downloads(0).values())
        ),
    }
    return silo, wire, task


@needs_fmnist
def test_a_slowed_silo_answers_its_task_only_after_its_delay(tmp_path):
    """The same task to a silo without a delay and to one with one: the second's RESULT leaves at
    least the delay later than its TRAIN came, and carries the same upload (a delay, not other work)."""
    answers = {}
    for delay in (0.0, DELAY_S):
        silo, wire, task = _silo(tmp_path, delay)
        train = Message(protocol.TRAIN, 0, 1)
        train.add_params("round", 0)
        train.add_params("tasks", [task])
        came = time.monotonic()
        silo.on_train(train)
        sent = [(t, msg) for t, msg in wire.sent if msg.get_type() == protocol.RESULT]
        assert len(sent) == 1
        answers[delay] = (sent[0][0] - came, sent[0][1].get("results")[0])
    (_, plain), (waited, slowed) = answers[0.0], answers[DELAY_S]
    assert waited >= DELAY_S
    assert plain["n"] == slowed["n"] and plain["upload"].keys() == slowed["upload"].keys()
    assert all(
        (plain["upload"]["model"][k] == slowed["upload"]["model"][k]).all() for k in plain["upload"]["model"]
    )


@needs_fmnist
@pytest.mark.slow
def test_a_buffered_grpc_run_goes_on_without_waiting_for_its_slowed_site(tmp_path):
    """gRPC, 2 silos of one party each training at once, K = 1, 3 rounds; silo 2 started with its own
    `--set device_args.delay_per_round_s=15` (why processes: the setting is the silo's command line,
    taken while the server's config is the run's). The server takes party 0's updates as they come
    and ends the run with three buffers of party 0 alone, long before party 1's first update."""
    extra = ["server_args.aggregation=buffered", "server_args.buffer_size=1", "train_args.comm_round=3"]
    extra += ["validation_args.local_test=false"]  # no evaluation round waits for every silo's report
    cmd, out = grpc_command(tmp_path, 2, *extra)
    server, log = start_rank(cmd, 0, tmp_path)
    slow = [*cmd, "--set", "device_args.delay_per_round_s=15"]
    procs = [server, start_rank(cmd, 1, tmp_path)[0], start_rank(slow, 2, tmp_path)[0]]
    try:
        assert conformance.wait_all([server], 120) == [0], log.read_text()[-3000:]
        assert "waits 15 s before it answers" in (tmp_path / "rank-2.log").read_text()
    finally:
        for proc in procs:
            conformance.stop(proc)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["updates"] for r in records] == [[[0, 0]], [[0, 1]], [[0, 2]]]
