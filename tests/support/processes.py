"""Real processes of a test's runs, on 127.0.0.1: a cross-silo gRPC run's command and its ranks
started one by one, a log waited on, a tiny simulation through the command line, and code in a
fresh interpreter. Every wait is bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fedml_moon import conformance
from tests.support import ROOT
from tests.support.server import FEDAVG_CONFIG

HEARTBEAT_S = 0.3  # dead after 3 periods: 0.9 s; a party's local round: ~8 steps of 0.5 s, 4 s
SLOW_STEPS = [
    f"common_args.plugins=[{ROOT / 'tests' / 'support' / 'slow_plugin.py'}:slow]",
    "train_args.algorithm=fedavg_slow",
    "train_args.comm_round=2",
    "data_args.max_train_samples=800",  # ~8 steps a party
    f"comm_args.heartbeat_s={HEARTBEAT_S}",
]
"""FedAvg whose every local step sleeps (tests/support/slow_plugin.py): local rounds many heartbeat
periods long."""


def grpc_command(tmp_path: Path, silos: int, *extra: str) -> tuple[list[str], Path]:
    """The command line of a tiny cross-silo FedAvg run of `silos` silos over gRPC (an ipconfig of
    free ports), `extra` added; without its `--rank`. Also the run's output folder."""
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
    return conformance.cli_command("run", FEDAVG_CONFIG, overrides, out), out


def start_rank(cmd: list[str], rank: int, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`cmd` started as rank `rank`, its output to tmp_path/rank-R.log: (the process, its log)."""
    log = tmp_path / f"rank-{rank}.log"
    return conformance.spawn(
        [*cmd, "--rank", str(rank)], log, conformance.process_env(tmp_path), tmp_path
    ), log


def wait_for_text(log: Path, text: str, timeout_s: float) -> None:
    """Wait until `log` holds `text`; fail, showing the log's end, after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {log}:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)


def simulate_process(
    out: Path, config: str, *overrides: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m fedml_moon simulate` of the repository's `config` with `overrides`, as a fresh
    process in `out`'s parent folder (its HOME a folder there), its output captured."""
    cmd = [
        sys.executable,
        "-m",
        "fedml_moon",
        "simulate",
        "--cf",
        str(ROOT / config),
        "--output-dir",
        str(out),
    ]
    for item in overrides:
        cmd += ["--set", item]
    full_env = {**os.environ, "HOME": str(out.parent / "home"), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env, cwd=out.parent)


def fresh_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter: what a process imports is only visible from its start."""
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
