"""The deployment modes' commands (docs/how-to/deployment-modes.md, and the README's): the MPI runs,
cross-silo over gRPC, MQTT + S3 and the hierarchical silo under torchrun, as written from the
repository root at tiny scale (tests/support/doc_runs.py; RANK, R and `edge.yaml` substituted). Every
process started here runs on 127.0.0.1, has its wait bounded and is stopped at the end."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedml_moon import conformance
from tests.support import ROOT
from tests.support.doc_commands import (
    EDGE,
    EDGE_COPY,
    GRPC_SERVER,
    GRPC_SILO,
    MPI_CROSS_SILO,
    MPI_HIERARCHICAL,
    MPI_HOSTS,
    MPI_SIMULATION,
)
from tests.support.doc_runs import completed, grpc_comm, quiet, run_all, shell_env, tiny_sets
from tests.support.doc_table import COMMANDS
from tests.support.marks import needs_fmnist


@needs_fmnist
@pytest.mark.slow
def test_mpi_commands(tmp_path, home):
    """run/mpirun.sh adds what mpirun needs here (root, 2 cores); the cross-silo run takes its rank
    count from the config (2 silos at tiny scale: 3 ranks), also through the guide's hostfile. The
    hierarchical one (2 silos of 2 processes: 5 ranks, after the others), whose job ends when a
    group process is killed after the first checkpoint, started again with --resume, ends on the
    model of the run of one-process silos (ROUNDS rounds each, in float64: <= 1e-12, a bound float32's
    rounding alone would break over those 32 steps a party)."""
    started = time.monotonic()
    cmds, outs = [], []
    commands = (MPI_SIMULATION, MPI_CROSS_SILO, MPI_HOSTS, MPI_HIERARCHICAL)
    for i, command in enumerate(commands):
        outs.append(tmp_path / f"run-{i}")
        sets = tiny_sets(command)
        if command in (MPI_CROSS_SILO, MPI_HIERARCHICAL):  # long enough to be stopped midway
            sets = tiny_sets(command + "".join(f" --set {s}" for s in COMPARED)) + [
                a for s in COMPARED for a in ("--set", s)
            ]
        cmds.append([*shlex.split(command), *sets, "--output-dir", str(outs[-1])])
    logs = run_all(cmds[:3], tmp_path / "logs", home, 420)
    _kill_a_group_process_after_the_first_checkpoint(cmds[3], outs[3], tmp_path / "killed.log", home)
    logs += run_all([[*cmds[3], "--resume", str(outs[3])]], tmp_path / "resumed", home, 420)
    for log_path in logs:
        text = quiet(log_path)
        assert {"rank 0", "rank 1", "rank 2"} <= set(re.findall(r"rank \d+", text)), text[-2000:]
    assert "resuming after the checkpoint of round" in text, text[-3000:]
    for silo in (1, 2):
        for process in (0, 1):
            assert f"silo {silo}: process {process} of 2 (gloo)" in text, text[-3000:]
    last = f"silo group process 1 of 2: round {ROUNDS - 1} trained"
    assert text.count(last) == 2, text[-3000:]  # a follower each
    for out, rounds in zip(outs, (1, ROUNDS, 1, ROUNDS), strict=True):
        completed(out, rounds)
    one, group = (torch.load(o / "final_model.pt", weights_only=True) for o in (outs[1], outs[3]))
    assert one["encoder.conv1.weight"].dtype == torch.float64
    assert max(float((one[k] - group[k]).abs().max()) for k in one) <= 1e-12
    print(f"MPI README commands: {time.monotonic() - started:.1f} s")


ROUNDS = 4


COMPARED = [
    f"train_args.comm_round={ROUNDS}",
    "data_args.max_train_samples=1000",
    "train_args.batch_size=64",
    "train_args.precision=fp64",
    "train_args.checkpoint_every=1",
]
"""What the MPI runs of one-process and hierarchical silos add to TINY."""


def _kill_a_group_process_after_the_first_checkpoint(
    cmd: list[str], out: Path, log: Path, home: Path
) -> None:
    """Start `cmd` (an mpirun job of hierarchical silos); once its first checkpoint is written, SIGKILL
    silo 1's second process: mpirun ends the whole job (non-zero) within a minute, no rank left."""
    from fedml_moon.conformance.recovery import wait_checkpoint

    job = conformance.spawn(cmd, log, shell_env(home), ROOT)
    try:
        wait_checkpoint(out, 0, 240)
        assert job.poll() is None and not (out / "summary.json").exists(), log.read_text()[-3000:]
        pids = dict(re.findall(r"silo (\d: process \d) of 2 \(gloo\), pid (\d+)", log.read_text()))
        assert len(pids) == 4, log.read_text()[-3000:]
        os.kill(int(pids["1: process 1"]), signal.SIGKILL)
        code = job.wait(timeout=60)
        deadline = time.monotonic() + 30
        while (
            alive := [p for p in pids.values() if Path(f"/proc/{p}").exists()]
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        conformance.stop(job)
    assert code != 0 and not alive, (code, alive, log.read_text()[-3000:])


@needs_fmnist
@pytest.mark.slow
def test_grpc_commands(tmp_path, home):
    """The server gets the run's --set values; each silo only its comm settings (and its threads):
    the number of silos comes from train_args.client_num_in_total, the ipconfig CSV holds only the
    server's row, and silos take the run's config from the server."""
    started = time.monotonic()
    out = tmp_path / "run"
    comm = grpc_comm(tmp_path, out)
    silos = [
        [*shlex.split(GRPC_SILO.replace("RANK", str(r))), *comm, "--set", "device_args.torch_threads=1"]
        for r in (1, 2)
    ]
    server = [*shlex.split(GRPC_SERVER), *tiny_sets(GRPC_SERVER), *comm]
    for log_path in run_all([*silos, server], tmp_path / "logs", home, 420):
        quiet(log_path)
    completed(out, 1)
    print(f"gRPC README commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_mqtt_s3_commands(tmp_path, home):
    """Server and silo 1 from the shipped config with the local broker and S3 given by --set; silo 2
    from a copy of the config with them written in (`edge.yaml`, as the README describes)."""
    started = time.monotonic()
    with conformance.services(tmp_path / "services") as svc:
        moto = svc.procs[1].args
        assert moto[0] == str(ROOT / ".venv/bin/moto_server") and "-p" in moto  # the README's moto_server
        run_id = f"readme-{conformance.free_port()}"
        comm = [*svc.overrides, f"comm_args.run_id={run_id}", "comm_args.timeout_s=120"]
        edge = yaml.safe_load((ROOT / "config/modes/moon_edge_mqtt_s3.yaml").read_text())
        s3 = f"http://127.0.0.1:{svc.s3_port}"
        edge["comm_args"].update(mqtt_port=svc.mqtt_port, s3_endpoint=s3, run_id=run_id, timeout_s=120)
        (tmp_path / "edge.yaml").write_text(yaml.safe_dump(edge))
        out = tmp_path / "run"
        cmds = []
        for rank, command, extra in ((1, EDGE, comm), (2, EDGE_COPY, []), (0, EDGE, comm)):
            words = [str(tmp_path / "edge.yaml") if w == "edge.yaml" else w for w in shlex.split(command)]
            words = [str(rank) if w == "R" else w for w in words]
            sets = [a for item in extra for a in ("--set", item)]
            cmds.append([*words, *tiny_sets(command), *sets, "--output-dir", str(out)])
        for log_path in run_all(cmds, tmp_path / "logs", home, 420):
            quiet(log_path)
    completed(out, 1)
    print(f"MQTT + S3 README commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_hierarchical_commands(tmp_path, home):
    """The deployment guide's hierarchical silo, as written: silo 1 as torchrun's group of 2 processes
    on one host, then as 2 "hosts" of 1 process each (both here), beside silo 2 and the server."""
    one, *two = [c for c, kind in COMMANDS.items() if kind == "hierarchical"]
    assert "device_args.n_node_in_silo=2" in two[0] and "--node-rank 1" in two[1]
    for name, group in (("one-host", [one]), ("two-hosts", two)):
        out = tmp_path / name / "run"
        (tmp_path / name).mkdir()
        comm = grpc_comm(tmp_path / name, out)
        silo1 = [[*shlex.split(c), *comm, "--set", "device_args.torch_threads=1"] for c in group]
        silo2 = [*shlex.split(GRPC_SILO.replace("RANK", "2")), *comm, "--set", "device_args.torch_threads=1"]
        server = [*shlex.split(GRPC_SERVER), *tiny_sets(GRPC_SERVER), *comm]
        logs = run_all([*silo1, silo2, server], tmp_path / name / "logs", home, 420)
        completed(out, 1)
        said = "".join(p.read_text(errors="replace") for p in logs[: len(group)])
        assert (
            "silo 1: process 1 of 2 (gloo)" in said and "round 0 trained on its slice of every batch" in said
        )
        assert " rank 1 process 1 INFO " in said and " rank 1 process 0 INFO " in said  # as the guide says


@pytest.mark.slow
@pytest.mark.parametrize(
    ("left_out", "says"),
    [
        (
            "--set common_args.scenario=hierarchical ",
            "common_args.scenario is horizontal (a silo is one process)",
        ),
        (
            "--set device_args.n_proc_per_node=2",
            "n_node_in_silo x n_proc_per_node is 1 x 1 = 1, but torchrun",
        ),
    ],
)
def test_the_one_host_silo_command_missing_a_key_is_refused_naming_the_sets_to_add(home, left_out, says):
    """The guide's one-host silo command with one of its --set left out: every process that gets as
    far as its config refuses it before anything is built (no output folder), naming the --set that
    make it agree with torchrun; without the scenario each process would otherwise act as the whole
    silo 1."""
    from fedml_moon.conformance import free_port

    one = next(c for c, kind in COMMANDS.items() if kind == "hierarchical")
    assert left_out in one
    cmd = one.replace(left_out, "").replace("--master-port 29500", f"--master-port {free_port()}")
    argv = [*shlex.split(cmd), "--output-dir", str(home / "never")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=shell_env(home), cwd=ROOT)
    fix = "--set device_args.n_node_in_silo=1 --set device_args.n_proc_per_node=2"
    # torchrun stops the other process once one has exited: each refused, or was stopped before it
    # got as far (on a busy machine the other may still be importing); none went further
    refused = done.stderr.count(says)
    assert done.returncode == 1 and refused in (1, 2) and done.stderr.count(fix) == refused, done.stderr
    assert not (home / "never").exists()


@pytest.mark.slow
def test_a_master_port_in_use_stops_torchrun_naming_it(home):
    """The guide's promise: the one-host silo command with its --master-port already taken stops
    within seconds (exit 1), its last line naming the port and that it is in use."""
    import socket

    one = next(c for c, kind in COMMANDS.items() if kind == "hierarchical")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = shlex.split(one.replace("--master-port 29500", f"--master-port {port}"))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=shell_env(home))
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1
    assert f"port: {port}" in last and "EADDRINUSE, message: address already in use" in last, last
