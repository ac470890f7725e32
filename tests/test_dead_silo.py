"""Rounds that survive a dead silo (gRPC, 127.0.0.1): a silo killed mid-run is noticed by its missing
heartbeats, left out of the aggregate (named in metrics.jsonl), and the run completes with the rest;
a silo that stalls and comes back has its late upload dropped and takes part again."""

from __future__ import annotations

import json
import signal
import time

from fedml_moon import conformance
from fedml_moon.cli import main
from fedml_moon.data.partition_file import load_partition_file
from fedml_moon.security import make_certs
from fedml_moon.status.record import read
from tests.support.marks import SLOW_WITH_DATA
from tests.support.monitoring import Port, site_entry
from tests.support.processes import grpc_command, start_rank, wait_for_text

pytestmark = SLOW_WITH_DATA

TOLERANT = ["comm_args.heartbeat_s=1", "comm_args.round_timeout_s=60", "comm_args.min_reports=2"]


def _records(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_killed_silo_with_default_settings_is_left_out_within_seconds_and_restarted_rejoins(
    tmp_path, capsys
):
    """Default heartbeats (5 s) and quorum (half of the sampled parties): the round goes on as soon as
    the silo is known dead, not at round_timeout_s; the silo started again takes part again. The
    server's status.json says the silo is gone, then back, and at the end how many rounds each site
    took part in (`fedml-moon status`); its status port shows the same on its page, in its JSON and
    in its metrics (in a browser and in Prometheus: tests/test_status_port_live.py)."""
    make_certs(tmp_path / "certs", 3, ["127.0.0.1"])
    port_sets = [
        "tracking_args.status_port=0",
        f"tracking_args.status_tokens={tmp_path / 'certs'}/server-tokens.json",
    ]
    cmd, out = grpc_command(
        tmp_path, 3, "train_args.comm_round=40", "comm_args.round_timeout_s=600", *port_sets
    )
    server, log = start_rank(cmd, 0, tmp_path)
    silos = [start_rank(cmd, r, tmp_path)[0] for r in (1, 2, 3)]
    wait_for_text(log, "round 1:", 150)
    port = Port(log, tmp_path / "certs" / "operator.token")
    conformance.stop(silos[1], first=signal.SIGKILL)  # rank 2 holds party 1
    killed_at = time.monotonic()
    wait_for_text(
        log, "goes on without parties [1] (rank(s) [2]): rank(s) [2] stopped sending heartbeats", 60
    )
    noticed = time.monotonic() - killed_at
    assert noticed < 30, noticed  # three heartbeat periods and a tick, not the 600 s deadline
    gone = _status_until(out, lambda s: not site_entry(s, 2)["connected"])  # status.json: within a second
    assert site_entry(gone, 1)["connected"] and site_entry(gone, 3)["connected"], gone
    assert gone["phase"] in ("training", "evaluating", "checkpointing") and gone["rounds"] == 40
    port.until(2, connected=False)
    env = conformance.process_env(tmp_path)
    again = conformance.spawn([*cmd, "--rank", "2"], tmp_path / "rank-2-again.log", env, tmp_path)
    try:
        wait_for_text(log, "rank 2 is back", 90)
        _status_until(out, lambda s: site_entry(s, 2)["connected"])
        port.until(2, connected=True)
        codes = conformance.wait_all([server, silos[0], again, silos[2]], 240)
    finally:
        for proc in [server, *silos, again]:
            conformance.stop(proc)
    assert codes == [0, 0, 0, 0]
    summary, records = json.loads((out / "summary.json").read_text()), _records(out)
    assert summary["status"] == "completed" and len(records) == 40
    assert "missing_parties" not in records[0] and "missing_parties" not in records[-1]
    assert any(r.get("missing_parties") == [1] and r["parties"] == 2 for r in records)
    assert main(["status", str(out), "--json"]) == 0  # the command as an operator types it
    end = json.loads(capsys.readouterr().out)
    assert end["phase"] == "finished" and end["rounds_completed"] == end["rounds"] == 40
    without_2 = sum(1 for r in records if 1 in r.get("missing_parties", []))
    took_part = {site["rank"]: site["rounds"] for site in end["sites"]}
    assert took_part == {1: 40, 2: 40 - without_2, 3: 40}, (took_part, without_2)
    assert [site["refused"] for site in end["sites"]] == [0, 0, 0]
    for site in end["sites"]:  # what the server's transport took from each and sent it
        assert site["messages"] > 40 and site["bytes_received"] > 0 and site["bytes_sent"] > 0, site
    assert main(["status", str(out / "rank-1")]) == 0  # what a site sees of the run: its own view
    said = capsys.readouterr().out
    assert "round 39 of 40 (from 0), finished (status written" in said, said
    assert "site rank 1: trained 40 rounds; the server: connected" in said, said
    own = json.loads((out / "rank-1" / "status.json").read_text())  # nothing of another site
    fields = {"run", "algorithm", "rounds", "round", "phase", "site", "server", "round_time_s", "eta_s"}
    assert set(own) == {*fields, "updated"} and set(own["site"]) == {"rank", "rounds", "samples"}, own
    counts = load_partition_file(out / "rank-1" / "partition.json").counts.tolist()
    assert own["site"]["samples"] == sum(counts[0])  # rank 1 holds party 0: its training samples


def _status_until(out, condition, within_s: float = 30.0) -> dict:
    """The run's status (fedml_moon.status.record.read) once `condition` holds of it."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            status = read(out)
            if status["sites"] and condition(status):
                return status
        except FileNotFoundError:
            status = None
        assert time.monotonic() < deadline, f"status.json did not say so within {within_s:.0f} s: {status}"
        time.sleep(0.2)


def test_a_stalled_silo_has_its_late_upload_dropped_and_comes_back(tmp_path):
    cmd, out = grpc_command(tmp_path, 3, "train_args.comm_round=12", *TOLERANT)
    server, log = start_rank(cmd, 0, tmp_path)
    silos = [start_rank(cmd, r, tmp_path)[0] for r in (1, 2, 3)]
    wait_for_text(log, "round 1:", 150)
    silos[2].send_signal(signal.SIGSTOP)  # rank 3 (party 2) freezes: no heartbeats, no results
    try:
        wait_for_text(log, "goes on without parties [2] (rank(s) [3])", 60)
    finally:
        silos[2].send_signal(signal.SIGCONT)
    wait_for_text(log, "dropped a late result message from rank 3", 60)
    assert conformance.wait_all([server, *silos], 300) == [0, 0, 0, 0]
    records = _records(out)
    assert any("missing_parties" in r for r in records)
    assert "missing_parties" not in records[-1]  # back for the last rounds
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
