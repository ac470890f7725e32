"""A hostile silo in a real run, over gRPC (TLS, its own valid token) and over MQTT + S3: every round it
sends well-formed messages with hostile values drawn from tests/support/hostile.py (another silo's party,
wrong, negative and huge sample counts, metrics named like the server's fields, huge integers, a
tampered model, several records, HELLOs from new processes, messages of another phase or round, types
that are not strings) and the raw frames found on the wire (a 5,000-digit JSON integer, random bytes,
a pickle), then its honest result. The server refuses each, naming the field, and the run ends with
bitwise the final model and the records of the run in which the same silo only sends its honest
result."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.security import make_certs
from tests.support.marks import SLOW_WITH_DATA
from tests.support.server import FEDAVG_CONFIG

pytestmark = SLOW_WITH_DATA

HOSTILE = Path(__file__).resolve().parent / "support" / "hostile_silo.py"
BASE = [
    *conformance.TINY,
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=3",
    "train_args.comm_round=3",
    "validation_args.local_test=false",
    "common_args.training_type=cross_silo",
    "comm_args.heartbeat_s=1",
    "comm_args.timeout_s=60",
]


def _grpc(tmp_path: Path) -> tuple[list[str], dict[int, list[str]], dict[int, dict]]:
    """gRPC with TLS and tokens: the overrides, each rank's extra arguments and environment."""
    certs = tmp_path / "certs"
    make_certs(certs, silos=3, hosts=["127.0.0.1"])
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 4, conformance.free_port())
    overrides = ["comm_args.backend=GRPC", f"comm_args.grpc_ipconfig_path={ipconfig}", "comm_args.tls=on"]
    overrides += ["comm_args.auth=token", f"comm_args.tls_ca={certs / 'ca.pem'}"]
    server = [f"comm_args.tls_cert={certs / 'server.pem'}", f"comm_args.tls_key={certs / 'server.key'}"]
    server += [f"comm_args.token_path={certs / 'server-tokens.json'}"]
    env = {r: {"FEDML_MOON_TOKEN": (certs / f"silo-{r}.token").read_text()} for r in (1, 2, 3)}
    return overrides, {0: server}, env


def _run(
    tmp_path: Path, mode: str, overrides: list[str], extra: dict, envs: dict, attacker_code: int | None = 0
) -> tuple[dict, list, str]:
    """Server and silos 1, 2 through the CLI, silo 3 hostile (`mode`); summary, records, server log.
    The server and the honest silos exit 0; silo 3 with `attacker_code` (None: stopped when they end)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out, settings = tmp_path / "out", [*BASE, *overrides]
    cmd = conformance.cli_command("run", FEDAVG_CONFIG, settings, out)
    base_env = conformance.process_env(tmp_path)
    procs, logs = [], [tmp_path / f"rank-{r}.log" for r in range(4)]
    hostile = [sys.executable, str(HOSTILE), "--cf", str(FEDAVG_CONFIG), "--rank", "3", "--mode", mode]
    hostile += ["--out", str(tmp_path / "hostile")] + [x for s in settings for x in ("--set", s)]
    try:
        for rank in (0, 1, 2, 3):
            own = [x for s in extra.get(rank, []) for x in ("--set", s)]
            argv = hostile if rank == 3 else [*cmd, "--rank", str(rank), *own]
            env = {**base_env, **envs.get(rank, {})}
            procs.append(conformance.spawn(argv, logs[rank], env, tmp_path))
        if attacker_code is None:  # the honest processes decide the run's end; the attacker is stopped
            codes = [*conformance.wait_all(procs[:3], 300), None]
        else:
            codes = conformance.wait_all(procs, 300)
    finally:
        for proc in procs:
            conformance.stop(proc)
    text = logs[0].read_text(errors="replace")
    wanted = [0, 0, 0, attacker_code]
    assert codes == wanted, (codes, "\n".join(p.read_text(errors="replace")[-1500:] for p in logs))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), records, text


TIMING = ("round_time_s", "wire_bytes_sent", "wire_bytes_received")
REFUSALS = (
    "refused a result message from rank 3: field results[0]",
    "refused rank 3's result: results",
    "which is not one of the algorithm's terms",
    "dropped a",  # out of round, repeated, of another phase
    "refused a",
)


def test_a_hostile_silo_is_refused_and_the_run_is_the_run_without_its_attacks(tmp_path):
    grpc_settings, server_extra, envs = _grpc(tmp_path)
    reference, ref_records, _ = _run(tmp_path / "honest", "honest", grpc_settings, server_extra, envs)
    attacked, records, text = _run(tmp_path / "grpc", "attack", grpc_settings, server_extra, envs)
    for named in REFUSALS:
        assert named in text, named
    assert "refused a call from" in text  # the raw frames: gRPC refuses what is not a message
    with conformance.services(tmp_path / "services") as svc:
        mqtt = ["comm_args.backend=MQTT_S3", f"comm_args.run_id=hostile-{svc.mqtt_port}", *svc.overrides]
        over_mqtt, mqtt_records, mqtt_text = _run(tmp_path / "mqtt", "attack", mqtt, {}, {})
    for named in REFUSALS:
        assert named in mqtt_text, named
    assert "dropped a malformed message" in mqtt_text
    assert len(text) < 2_000_000 and len(mqtt_text) < 2_000_000  # refusals are logged bounded
    plain = [{k: v for k, v in r.items() if k not in TIMING} for r in ref_records]
    for summary, recs in ((reference, ref_records), (attacked, records), (over_mqtt, mqtt_records)):
        assert summary["status"] == "completed" and len(recs) == 3
        assert all(r["parties"] == 3 and "missing_parties" not in r for r in recs)
        assert [{k: v for k, v in r.items() if k not in TIMING} for r in recs] == plain
        assert summary["final_model_sha256"] == reference["final_model_sha256"]


@pytest.mark.xfail(
    reason="a known limit (docs/explanation/security.md): on 2 busy cores the churn can starve the "
    "honest silos' calls until the round times out",
    strict=False,
)
def test_a_silo_that_churns_subscribe_calls_harms_no_honest_silo(tmp_path):
    """Silo 3 opens Subscribe calls for its own frames on a second connection without pause (each
    cancelled at once): the server refuses them past the rank's call rate before reading them, with a
    bounded log. A newer Subscribe of a rank ends its older one, so the churner deafens its own silo
    (which misses rounds: the quorum goes on without it after comm_args.round_timeout_s); the honest
    silos keep their streams and sends (none ends CANCELLED, none subscribes again), are in every
    round, and the run completes.

    Expected to fail while the limit the security page states stands: with the machine's cores
    busy (the suite's other worker), the churn starves the honest silos' calls until the round
    times out; it passes where cores are to spare, and must pass always once the limit is fixed."""
    grpc_settings, server_extra, envs = _grpc(tmp_path)
    settings = [*grpc_settings, "comm_args.round_timeout_s=6"]
    summary, records, text = _run(tmp_path, "churn", settings, server_extra, envs, attacker_code=None)
    attacker = (tmp_path / "rank-3.log").read_text()
    calls = max(int(n) for n in re.findall(r"churned (\d+) Subscribe calls", attacker))
    refused = sum(int(n) for n in re.findall(r"refused (\d+) more from .* too many Subscribe calls", text))
    assert calls >= 1_000 and refused >= 1_000, (calls, refused)  # the attack took place
    assert "rank 3 starts Subscribe calls faster than 2 a second" in text
    assert text.count("rank 3 subscribed") <= 500 and len(text.splitlines()) < 2_000  # bounded log
    for rank in (1, 2):
        silo_log = (tmp_path / f"rank-{rank}.log").read_text()
        assert "CANCELLED" not in silo_log and "subscription to" not in silo_log, silo_log[-2000:]
    assert summary["status"] == "completed" and len(records) == 3
    assert all(r["parties"] >= 2 and set(r.get("missing_parties", [])) <= {2} for r in records)
