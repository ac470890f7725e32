"""Hierarchical silos under one mpirun (fedml_moon.distributed.silo.mpi_groups): where each rank stands,
how many ranks a job needs, and a job of the wrong size refused by every rank with the -np to give.
(The guide's command, its model against one-process silos, a dead group process ending the job,
and its resume: test_docs_deployment_modes.py `test_mpi_commands`.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fedml_moon.cli.train import mpi_ranks
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.distributed.silo.mpi_groups import layout

ROOT = Path(__file__).resolve().parent.parent
MPI_CONFIG = ROOT / "config" / "modes" / "moon_cross_silo_mpi.yaml"
GROUPS = ["common_args.scenario=hierarchical", "device_args.n_proc_per_node=2"]


def _config(*sets: str):
    return load_config(MPI_CONFIG, [*GROUPS, *sets])


def test_rank_zero_is_the_server_and_each_silo_takes_p_consecutive_ranks_led_by_the_first():
    cfg = _config("train_args.client_num_in_total=3", "train_args.client_num_per_round=3")
    places = [layout(rank, 7, cfg) for rank in range(7)]
    assert places == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    two_hosts = _config("device_args.n_node_in_silo=2", "device_args.n_proc_per_node=1")
    assert [layout(r, 21, two_hosts) for r in (1, 2, 3, 20)] == [(1, 0), (1, 1), (2, 0), (10, 1)]


@pytest.mark.parametrize("size", [2, 11, 20, 22])
def test_a_job_of_another_size_is_refused_with_the_np_to_give(size):
    with pytest.raises(ConfigError, match=rf"10 silos .* of 2 processes .* mpirun -np 21, not {size}"):
        layout(0, size, _config())


def test_run_mpirun_sh_counts_the_server_and_every_group_process():
    sets = [a for s in GROUPS for a in ("--set", s)]
    assert mpi_ranks(["run", "--cf", str(MPI_CONFIG), *sets]) == 21
    assert mpi_ranks(["run", "--cf", str(MPI_CONFIG)]) == 11  # one-process silos


@pytest.mark.slow
def test_every_rank_of_a_job_of_the_wrong_size_says_the_np_to_give(tmp_path):
    """Through mpirun: 3 ranks for 2 silos of 2 processes; each rank exits 2 naming -np 5, before
    it builds anything (no output folder)."""
    sets = ["train_args.client_num_in_total=2", "train_args.client_num_per_round=2", *GROUPS]
    cmd = ["bash", "run/mpirun.sh", "3", "run", "--cf", str(MPI_CONFIG)]
    cmd += [a for s in sets for a in ("--set", s)] + ["--output-dir", str(tmp_path / "run")]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and said.count("mpirun -np 5, not 3") == 3, said[-3000:]
    assert not (tmp_path / "run").exists()
