"""Which GPU a process takes (the plumbing, on any machine): FedML's GPU mapping file, else its rank on
its host, so that processes on a second host start from that host's GPU 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedml_moon.adapters.gpus import mapping_slots, select_gpu
from fedml_moon.config.load import load_config
from fedml_moon.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
MPI = ROOT / "config" / "modes" / "moon_cross_silo_mpi.yaml"
GRPC = ROOT / "config" / "modes" / "moon_cross_silo_grpc.yaml"


def test_two_hosts_under_mpirun_map_by_local_rank_not_global_rank():
    """mpirun --hostfile across two hosts of 2 GPUs, 6 ranks (3 per host): ranks 3, 4, 5 sit on the
    second host, local ranks 0, 1, 2, and take its GPUs 0, 1, 0 (the global rank would say 3 % 2)."""
    cfg = load_config(MPI, ["train_args.client_num_in_total=5", "train_args.client_num_per_round=5"])
    for world, local, gpu in ((3, 0, 0), (4, 1, 1), (5, 2, 0), (1, 1, 1)):
        env = {
            "OMPI_COMM_WORLD_RANK": str(world),
            "OMPI_COMM_WORLD_SIZE": "6",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        }
        assert select_gpu(cfg, world, 2, env) == gpu


def test_a_hierarchical_silo_maps_its_group_by_local_rank():
    cfg = load_config(GRPC, ["common_args.scenario=hierarchical", "device_args.n_proc_per_node=4"])
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert select_gpu(cfg, 1, 4, env) == 1
    assert select_gpu(load_config(GRPC, ["device_args.gpu_id=2"]), 0, 4, {}) == 2  # the server: gpu_id


def test_fedml_gpu_mapping_file_places_each_process_in_order(tmp_path):
    mapping = tmp_path / "gpu_mapping.yaml"
    mapping.write_text("mapping_default:\n  host1: [2, 1]\n  host2: [0, 3]\nsmall:\n  host1: [1]\n")
    assert mapping_slots(str(mapping), "mapping_default") == [
        ("host1", 0), ("host1", 0), ("host1", 1), ("host2", 1), ("host2", 1), ("host2", 1)
    ]  # fmt: skip
    sets = [
        f"device_args.gpu_mapping_file={mapping}",
        "train_args.client_num_in_total=5",
        "train_args.client_num_per_round=5",
    ]
    cfg = load_config(MPI, sets)
    env = {"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert select_gpu(cfg, 4, 2, env) == 1  # host2's GPU 1, as the file says (not the local rank)
    with pytest.raises(ConfigError, match="places 6 processes, and 3 share it here"):
        select_gpu(cfg, 1, 2, {**env, "OMPI_COMM_WORLD_SIZE": "3"})
    with pytest.raises(
        ConfigError,
        match=r"gpu_mapping_key: 'nope' is not a section of .* \(it has: mapping_default, small\)",
    ):
        select_gpu(load_config(MPI, [*sets, "device_args.gpu_mapping_key=nope"]), 1, 2, env)
