"""Secure aggregation over real processes (gRPC, MQTT + S3): the same final model as the standalone
loop (the decoded sum does not depend on the masks, so it is equal bit for bit), a silo that dies
after it sent its masked vector and before unmasking leaves a round that completes with the survivors'
sum, and a silo that sends a neighbour garbage for its encrypted shares is named by it and dropped
while the round completes with the honest silos' sum (gRPC, 127.0.0.1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedml_moon import conformance
from tests.support.marks import SLOW_WITH_DATA
from tests.support.processes import grpc_command, start_rank

pytestmark = SLOW_WITH_DATA

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
SECURE = ["validation_args.local_test=false", "privacy_args.secure_aggregation=true"]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _with_one_silo(tmp_path: Path, silos: int, script: str, rank: int, extra: list[str], timeout_s: float):
    """A gRPC run of `silos` silos through the command line, silo `rank` run by tests/support/`script`
    (a file, then its own arguments: the plugin's own silo with one behaviour changed): (return codes by
    rank, the server's log, out)."""
    cmd, out = grpc_command(tmp_path, silos, *extra)
    server, log = start_rank(cmd, 0, tmp_path)
    name, *words = script.split()
    own = [sys.executable, str(ROOT / "tests" / "support" / name), *words, *cmd[3:]]
    procs = [server] + [start_rank(own if r == rank else cmd, r, tmp_path)[0] for r in range(1, silos + 1)]
    try:
        codes = conformance.wait_all(procs, timeout_s)
    finally:
        for proc in procs:
            conformance.stop(proc)
    return codes, log.read_text(errors="replace"), out


def test_secure_aggregation_gives_the_standalone_model_in_every_mode(tmp_path):
    overrides = [*conformance.TINY, *SECURE, "train_args.comm_round=2", "train_args.client_num_per_round=3"]
    ref = conformance.run_mode("standalone", CONFIG, overrides, tmp_path)
    assert ref.ok, ref.tail()
    with conformance.services(tmp_path / "services") as services:
        for mode in ("cross-silo-grpc", "mqtt-s3"):  # MPI carries the same managers' messages
            run = conformance.run_mode(mode, CONFIG, overrides, tmp_path, services)
            assert run.ok, f"{mode}: {run.tail()}"
            digest = _summary(run.out_dir)["final_model_sha256"]
            assert digest == _summary(ref.out_dir)["final_model_sha256"], mode
            records = [json.loads(x) for x in (run.out_dir / "metrics.jsonl").read_text().splitlines()]
            assert all(r["parties"] == 3 and r["bytes_up"] > 0 for r in records), mode


def test_a_silo_dead_after_masking_leaves_a_round_with_the_survivors_sum(tmp_path):
    """3 silos (t = 2 of each neighbourhood of 3); silo 2 sends its masked vector, then dies when asked
    to unmask. Its self-mask is rebuilt from the two others' shares: round 0 completes with the sum of
    all three vectors, the same final model as the standalone run of that round."""
    extra = [*SECURE, "train_args.comm_round=1", "comm_args.heartbeat_s=1", "comm_args.round_timeout_s=120"]
    ref = conformance.run_mode(
        "standalone",
        CONFIG,
        [*conformance.TINY, *SECURE, *extra[2:3], "train_args.client_num_per_round=3"],
        tmp_path,
    )
    assert ref.ok, ref.tail()
    codes, text, out = _with_one_silo(tmp_path, 3, "dying_silo.py unmask", 2, extra, 240)
    assert codes[0] == 0 and codes[2] == 9, f"{codes}\n{text[-3000:]}"
    assert "secure aggregation goes on without parties [1] (rank(s) [2])" in text, text[-3000:]
    summary = _summary(out)
    assert summary["status"] == "completed"
    assert summary["final_model_sha256"] == _summary(ref.out_dir)["final_model_sha256"]


def test_a_silo_sending_garbage_shares_is_dropped_and_the_round_completes(tmp_path):
    """5 silos (t = 3 of 5); silo 1's party sends its first neighbour random bytes for a ciphertext.
    The neighbour names it, the server drops party 0 and rebuilds its s-seed from the 3 other holders:
    round 0 completes with the 4 honest parties' sum, party 0 named as missing."""
    extra = [*SECURE, "train_args.comm_round=1", "comm_args.heartbeat_s=1", "comm_args.round_timeout_s=120"]
    codes, text, out = _with_one_silo(tmp_path, 5, "garbling_silo.py", 1, extra, 300)
    assert codes[0] == 0, f"{codes}\n{text[-3000:]}"
    assert "parties [0] are dropped from the round: a neighbour could not decrypt" in text, text[-3000:]
    assert _summary(out)["status"] == "completed"
    (record,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["parties"] == 4 and record["missing_parties"] == [0]


def test_a_silo_that_falsely_names_an_honest_neighbour_costs_it_that_round_only(tmp_path):
    """4 silos, plain SecAgg (t = 3 of 4); silo 1's party names its lowest neighbour for bad shares it
    never had. The named party is dropped from the round; the survivors hold only 2 shares of its
    s-seed (its accuser's is missing), so it is asked for its own: the run completes, each round (the
    accuser lies in both) with the other 3 parties' sum."""
    extra = [*SECURE, "train_args.comm_round=2", "comm_args.heartbeat_s=1", "comm_args.round_timeout_s=120"]
    codes, text, out = _with_one_silo(tmp_path, 4, "accusing_silo.py", 1, extra, 300)
    assert codes == [0] * 5, f"{codes}\n{text[-3000:]}"
    assert "are dropped from the round: a neighbour could not decrypt" in text and "(named by {" in text
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["parties"] for r in records] == [3, 3] and all(len(r["missing_parties"]) == 1 for r in records)
    assert _summary(out)["status"] == "completed"
