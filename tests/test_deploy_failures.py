"""Cross-silo over gRPC on 127.0.0.1 when peers come late, never, or die: nobody hangs forever."""

from __future__ import annotations

import json
import signal
import time

from fedml_moon import conformance
from fedml_moon.records.folder import earlier_records
from tests.support.marks import SLOW_WITH_DATA
from tests.support.processes import grpc_command, start_rank, wait_for_text

pytestmark = SLOW_WITH_DATA


def test_server_first_then_silos(tmp_path):
    cmd, out = grpc_command(tmp_path, 2, "train_args.comm_round=2")
    procs = [start_rank(cmd, 0, tmp_path)[0]]
    time.sleep(8)  # the server is up and waiting before any silo exists
    procs += [start_rank(cmd, r, tmp_path)[0] for r in (1, 2)]
    assert conformance.wait_all(procs, 180) == [0, 0, 0]
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_a_silo_with_another_config_is_refused_and_a_missing_one_named(tmp_path):
    cmd, out = grpc_command(tmp_path, 2, "comm_args.timeout_s=6")
    server, log = start_rank(cmd, 0, tmp_path)
    silo, _ = start_rank(cmd, 1, tmp_path)
    wrong, wrong_log = start_rank([*cmd, "--set", "train_args.learning_rate=0.2"], 2, tmp_path)
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
    cmd, out = grpc_command(
        tmp_path, 3, "train_args.comm_round=50", "comm_args.timeout_s=8", "comm_args.min_reports=all"
    )
    server, log = start_rank(cmd, 0, tmp_path)
    silos = [start_rank(cmd, r, tmp_path)[0] for r in (1, 2, 3)]
    wait_for_text(log, "round 1:", 150)
    conformance.stop(silos[1], first=signal.SIGKILL)  # rank 2 dies mid-run, saying nothing
    killed_at = time.monotonic()
    codes = conformance.wait_all([server, silos[0], silos[2]], 90)
    assert time.monotonic() - killed_at < 60
    assert codes == [1, 1, 1], codes
    assert "no answer from rank(s) [2]" in log.read_text()
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "failed" and len(records) >= 2 and summary["rounds_completed"] == len(records)
