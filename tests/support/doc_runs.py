"""How the tests of the documented commands run them: from the repository root, at tiny scale (TINY
appended, a key the command sets itself keeping its value), every process on 127.0.0.1, its wait
bounded and stopped at the end, and its output checked to start with the plugin's own log line."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

from fedml_moon import conformance
from tests.support import ROOT

TINY = [
    "data_args.max_train_samples=100",
    "data_args.max_test_samples=50",
    "train_args.client_num_in_total=2",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=1",
    "train_args.epochs=1",
    "train_args.batch_size=16",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]
"""Appended to every run (smaller than conformance.TINY: these tests only ask whether a command runs)."""

NOISE = ("RequestsDependencyWarning", "pkg_resources is deprecated", "args.rank = ")
"""What FedML's start-up used to print in every process (tests `fedml_moon.adapters.compat`)."""
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d( rank \d+( process \d+)?)? [A-Z]+ \S+: ")


def tiny_sets(command: str) -> list[str]:
    """`--set` arguments of TINY, leaving out keys the command sets itself."""
    words = shlex.split(command)
    own = {words[i + 1].split("=", 1)[0] for i, w in enumerate(words[:-1]) if w == "--set"}
    return [a for item in TINY if item.split("=", 1)[0] not in own for a in ("--set", item)]


def shell_env(home: Path) -> dict[str, str]:
    """The environment of a shell: no mpirun root permission here (run/mpirun.sh must add it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", AWS_ACCESS_KEY_ID="testing")
    env.update(AWS_SECRET_ACCESS_KEY="testing")  # moto takes any
    return env


def quiet(log_path: Path) -> str:
    """The process's output: its first line is the plugin's own log, and FedML's noise is gone (a
    sweep's run.log starts with the `$ command` line the sweep writes)."""
    text = re.sub(r"\A\$ .*\n", "", log_path.read_text(errors="replace"))
    assert text and LOG_LINE.match(text), f"{log_path.name} starts with: {text[:300]!r}"
    noise = [s for s in NOISE if s in text]
    assert not noise, f"{log_path.name} prints {noise}"
    return text


def run_all(cmds: list[list[str]], folder: Path, home: Path, timeout_s: float) -> list[Path]:
    """Start the commands from the repository root (a second apart, in order), wait for all (bounded),
    stop every one; assert each exited 0. Returns their logs."""
    folder.mkdir(parents=True, exist_ok=True)
    logs = [folder / f"process-{i}.log" for i in range(len(cmds))]
    procs = []
    try:
        for i, (cmd, log_path) in enumerate(zip(cmds, logs, strict=True)):
            if i:
                time.sleep(1.0)
            procs.append(conformance.spawn(cmd, log_path, shell_env(home), ROOT))
        codes = conformance.wait_all(procs, timeout_s)
    finally:
        for proc in procs:
            conformance.stop(proc)
    tails = "\n".join(
        f"--- {p.name}: {c}\n{p.read_text(errors='replace')[-3000:]}"
        for p, c in zip(logs, codes, strict=True)
    )
    assert codes == [0] * len(cmds), tails
    return logs


def wait_for_log(log_path: Path, text: str, within_s: float) -> None:
    """Wait until `log_path` holds `text`; fail after `within_s`."""
    deadline = time.monotonic() + within_s
    while text not in (log_path.read_text(errors="replace") if log_path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {log_path}"
        time.sleep(0.2)


def completed(out_dir: Path, rounds: int) -> dict:
    """The run's summary, once it says the run completed its `rounds` rounds."""
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == rounds, summary
    return summary


def entry_point(command: str) -> list[str]:
    """The arguments of a `.venv/bin/fedml-moon` command (given to main())."""
    words = shlex.split(command)
    assert words[0] == ".venv/bin/fedml-moon", command
    return words[1:]


def grpc_comm(tmp_path: Path, out: Path) -> list[str]:
    """What every process of a gRPC run here adds: an ipconfig CSV of the server's row only, on a free
    port of 127.0.0.1, a bounded wait and the run's output folder."""
    ipconfig = tmp_path / "ipconfig.csv"
    port = conformance.free_port()
    ipconfig.write_text(
        f"eid,rank,grpc_server_ip,grpc_server_port,ingress_ip\n0,0,127.0.0.1,{port},127.0.0.1\n"
    )
    comm = ["--set", f"comm_args.grpc_ipconfig_path={ipconfig}", "--set", "comm_args.timeout_s=120"]
    return [*comm, "--output-dir", str(out)]
