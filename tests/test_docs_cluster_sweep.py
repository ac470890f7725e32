"""The cluster how-to's commands (docs/how-to/cluster-sweep.md) as typed, through the local executor
and on a one-node Slurm cluster started here (tests/support/slurm_cluster.py), at tiny scale
(tests/support/doc_runs.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.doc_commands import CLUSTER_LOCAL, CLUSTER_SLURM, CLUSTER_STATUS, CLUSTER_WAIT
from tests.support.doc_runs import entry_point, shell_env, tiny_sets
from tests.support.marks import needs_fmnist


@needs_fmnist
@pytest.mark.slow
def test_cluster_sweep_commands(tmp_path, home):
    """The cluster how-to as typed (6 tiny runs of the LG-FedAvg sweep): through the local executor,
    then on a one-node Slurm cluster started here (partition `debug`), 4 of its runs complete already
    (copies of the local executor's), the other 2 submitted, its states shown, followed to the end;
    `--status` then says every run is complete."""
    from tests.support import slurm_cluster

    env = {**shell_env(home), "PYTHONPATH": str(ROOT)}
    shards = ["--set", "train_args.client_num_in_total=5", "--set", "train_args.client_num_per_round=5"]

    def run(command: str, output: Path, *, env: dict[str, str] = env) -> subprocess.CompletedProcess:
        words = [w.replace("PARTITION", "debug") for w in entry_point(command)]
        more = [*shards, "--poll", "1"] if command == CLUSTER_WAIT else shards  # not 30 s between looks
        argv = [
            sys.executable,
            "-m",
            "fedml_moon",
            *words,
            *tiny_sets(command),
            *more,
            "--output",
            str(output),
        ]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    def all_complete(output: Path, env: dict[str, str]) -> None:
        status = run(CLUSTER_STATUS, output, env=env)
        assert status.returncode == 0 and status.stdout.splitlines()[-1] == "6 runs: 6 complete", status

    done = run(CLUSTER_LOCAL, tmp_path / "local")
    assert done.returncode == 0, done.stderr[-3000:]
    all_complete(tmp_path / "local", env)
    try:
        cluster = slurm_cluster.start()
    except slurm_cluster.Unavailable as err:
        pytest.skip(f"the local executor's commands ran; Slurm cannot start here: {err}")
    try:
        slurm_env, output = {**env, "SLURM_CONF": cluster.env["SLURM_CONF"]}, tmp_path / "slurm"
        local = sorted(p for p in (tmp_path / "local").iterdir() if (p / "summary.json").is_file())
        for folder in local[:4]:  # complete already (the local executor's): Slurm runs the other 2
            shutil.copytree(folder, output / folder.name)
        done = run(CLUSTER_SLURM, output, env=slurm_env)
        assert done.returncode == 0 and "submitted 2 runs to slurm" in done.stderr, done.stderr[-3000:]
        shown = run(CLUSTER_STATUS, output, env=slurm_env).stdout
        assert all(f"config={c},random_seed={s}" in shown for c in ("lg", "fedavg_shards") for s in (0, 1, 2))
        done = run(CLUSTER_WAIT, output, env=slurm_env)
        assert done.returncode == 0 and "0 submitted now" in done.stderr, done.stderr[-3000:]
        all_complete(output, slurm_env)
    finally:
        cluster.stop()
