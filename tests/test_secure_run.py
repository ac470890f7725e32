"""A cross-silo gRPC run with TLS and per-silo tokens, forged calls thrown at the live server while
it trains; the run completes, and no secret given in the environment lands in any file it wrote."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import grpc
import pytest

from fedml_moon import conformance
from fedml_moon.distributed.transport.grpc_transport import SERVICE
from fedml_moon.security import make_certs
from tests.support.marks import SLOW_WITH_DATA
from tests.support.processes import wait_for_text
from tests.support.server import FEDAVG_CONFIG

pytestmark = SLOW_WITH_DATA

WANDB_SECRET = "wandb-secret-4f1c9a7e2b"
S3_SECRET = "s3-secret-8d2e6b0c"


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_tls_token_run_survives_forged_calls_and_leaks_no_secret(tmp_path):
    certs = tmp_path / "certs"
    make_certs(certs, silos=2, hosts=["127.0.0.1"])
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 3, conformance.free_port())
    overrides = [
        *conformance.TINY,
        "train_args.client_num_in_total=2",
        "train_args.client_num_per_round=2",
        "train_args.comm_round=12",
        "tracking_args.enable_wandb=true",
        "tracking_args.wandb_mode=offline",
        "common_args.training_type=cross_silo",
        "comm_args.backend=GRPC",
        f"comm_args.grpc_ipconfig_path={ipconfig}",
        "comm_args.tls=on",
        "comm_args.auth=token",
        f"comm_args.tls_ca={certs / 'ca.pem'}",
    ]
    out = tmp_path / "out"
    cmd = conformance.cli_command("run", FEDAVG_CONFIG, overrides, out)
    base = {
        **conformance.process_env(tmp_path),
        "WANDB_API_KEY": WANDB_SECRET,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
    }
    server_cmd = [*cmd, "--rank", "0", "--set", f"comm_args.tls_cert={certs / 'server.pem'}"]
    server_cmd += [
        "--set",
        f"comm_args.tls_key={certs / 'server.key'}",
        "--set",
        f"comm_args.token_path={certs / 'server-tokens.json'}",
    ]
    logs = [tmp_path / f"rank-{r}.log" for r in range(3)]
    tokens = {r: (certs / f"silo-{r}.token").read_text() for r in (1, 2)}
    procs = [conformance.spawn(server_cmd, logs[0], base, tmp_path)]
    for r in (1, 2):
        env = {**base, "FEDML_MOON_TOKEN": tokens[r]}
        procs.append(conformance.spawn([*cmd, "--rank", str(r)], logs[r], env, tmp_path))
    try:
        wait_for_text(logs[0], "round 1:", 150)
        address = f"127.0.0.1:{ipconfig.read_text().splitlines()[1].split(',')[3]}"
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes()))
        send = channel.unary_unary(f"/{SERVICE}/Send")
        good = (("x-fedml-moon-rank", "1"), ("authorization", f"Bearer {tokens[1]}"))
        bad = (("x-fedml-moon-rank", "2"), ("authorization", "Bearer guessed"))
        for body, meta in ((pickle.dumps({"x": 1}), good), (os.urandom(512), good), (b"x", bad)):
            with pytest.raises(grpc.RpcError):
                send(body, metadata=meta, timeout=10)
        channel.close()
        codes = conformance.wait_all(procs, 240)
    finally:
        for proc in procs:
            conformance.stop(proc)
    assert codes == [0, 0, 0], "\n".join(p.read_text()[-1500:] for p in logs)
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert logs[0].read_text().count("refused a call from") >= 3
    secrets = [WANDB_SECRET, S3_SECRET, *tokens.values()]
    written = _files(out) + logs
    assert any(p.match("*.wandb") for p in written)  # W&B wrote its run here, offline
    for path in written:
        data = path.read_bytes()
        assert not any(s.encode() in data for s in secrets), f"a secret is in {path}"
