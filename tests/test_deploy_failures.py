"""Cross-silo over gRPC on 127.0.0.1 when peers come late, never, or die: nobody hangs forever."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.records.folder import earlier_records

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "fedavg.yaml"


def _grpc(tmp_path: Path, silos: int, *extra: str) -> tuple[list[str], Path]:
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", silos + 1, conformance.free_port())
    overrides = [
        *conformance.TINY,
        f"train_args.client_num_in_total={silos}",
        f"train_args.client_num_per_round={silos}",
        "common_args.training_type=cross_silo",
        "comm_args.backend=GRPC",
        f"comm_args.grpc_ipconfig_path={ipconfig}",
        *extra,
    ]
    out = tmp_path / "out"
    return conformance.cli_command("run", CONFIG, overrides, out), out


def _start(cmd: list[str], rank: int, tmp_path: Path):
    log = tmp_path / f"rank-{rank}.log"
    return conformance.spawn(
        [*cmd, "--rank", str(rank)], log, conformance.process_env(tmp_path), tmp_path
    ), log


def _wait_for(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {log}:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)


def test_server_first_then_silos(tmp_path):
    cmd, out = _grpc(tmp_path, 2, "train_args.comm_round=2")
    procs = [_start(cmd, 0, tmp_path)[0]]
    time.sleep(8)  # the server is up and waiting before any silo exists
    procs += [_start(cmd, r, tmp_path)[0] for r in (1, 2)]
    assert conformance.wait_all(procs, 180) == [0, 0, 0]
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_a_silo_with_another_config_is_refused_and_a_missing_one_named(tmp_path):
    cmd, out = _grpc(tmp_path, 2, "comm_args.timeout_s=6")
    server, log = _start(cmd, 0, tmp_path)
    silo, _ = _start(cmd, 1, tmp_path)
    wrong, wrong_log = _start([*cmd, "--set", "train_args.learning_rate=0.2"], 2, tmp_path)
    started = time.monotonic()
    codes = conformance.wait_all([server, silo, wrong], 120)
    assert codes == [1, 1, 1], codes
    assert "config differs from the server's in train_args.learning_rate" in wrong_log.read_text()
    text = log.read_text()
    assert "no answer from rank(s) [2]" in text and "hello phase" in text
    # a run that never began records nothing that would refuse the same command started again
    assert "the run never began" in text and earlier_records(out) == []
    assert time.monotonic() - started < 100


def test_a_silo_killed_mid_run_stops_the_others_with_its_rank_named(tmp_path):
    cmd, out = _grpc(
        tmp_path, 3, "train_args.comm_round=50", "comm_args.timeout_s=8", "comm_args.min_reports=all"
    )
    server, log = _start(cmd, 0, tmp_path)
    silos = [_start(cmd, r, tmp_path)[0] for r in (1, 2, 3)]
    _wait_for(log, "round 1:", 150)
    conformance.stop(silos[1], first=signal.SIGKILL)  # rank 2 dies mid-run, saying nothing
    killed_at = time.monotonic()
    codes = conformance.wait_all([server, silos[0], silos[2]], 90)
    assert time.monotonic() - killed_at < 60
    assert codes == [1, 1, 1], codes
    assert "no answer from rank(s) [2]" in log.read_text()
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "failed" and len(records) >= 2 and summary["rounds_completed"] == len(records)
