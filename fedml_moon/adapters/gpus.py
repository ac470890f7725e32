"""Which GPU a process of a run takes: FedML's GPU mapping file when the config names one, else the
process's rank on its host (torchrun's LOCAL_RANK, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), so that one
`mpirun --hostfile` or one torchrun group across hosts maps each host's processes onto that host's
GPUs; a lone process (a gRPC or MQTT silo, the standalone run, the server) takes `device_args.gpu_id`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from fedml_moon.config.load import Config
from fedml_moon.errors import ConfigError


def mapping_slots(path: str, key: str) -> list[tuple[str, int]]:
    """FedML's GPU mapping (`gpu_mapping_file`, section `gpu_mapping_key`: host -> processes per
    GPU, e.g. `host1: [2, 1]`) as one (host, GPU) per process, in process order."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"device_args.gpu_mapping_file: {path} is not a file")
    data = yaml.safe_load(file.read_text()) or {}
    if not isinstance(data, dict) or key not in data:
        keys = ", ".join(map(str, data)) if isinstance(data, dict) else "none"
        raise ConfigError(f"device_args.gpu_mapping_key: {key!r} is not a section of {path} (it has: {keys})")
    hosts = data[key]
    ok = isinstance(hosts, dict) and all(
        isinstance(v, list) and all(type(n) is int and n >= 0 for n in v) for v in hosts.values()
    )
    if not ok:
        raise ConfigError(
            f"device_args.gpu_mapping_file: {path}'s {key} must map each host to processes per GPU, "
            "e.g. host1: [2, 1]"
        )
    return [
        (str(host), gpu) for host, counts in hosts.items() for gpu, n in enumerate(counts) for _ in range(n)
    ]


def process_slot(cfg: Config, rank: int, env: Mapping[str, str]) -> tuple[int, int, int | None]:
    """(this process's index, the processes that share the mapping, its rank on its host or None):
    a hierarchical silo's group (torchrun), an MPI run's ranks, or this process alone."""
    if cfg.common_args.scenario == "hierarchical" and rank != 0 and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if cfg.comm_args.backend == "MPI" and "OMPI_COMM_WORLD_SIZE" in env:
        local = env.get("OMPI_COMM_WORLD_LOCAL_RANK")
        return (
            int(env["OMPI_COMM_WORLD_RANK"]),
            int(env["OMPI_COMM_WORLD_SIZE"]),
            None if local is None else int(local),
        )
    return 0, 1, None


def select_gpu(cfg: Config, rank: int, gpus: int, env: Mapping[str, str] | None = None) -> int:
    """The GPU index of rank `rank`'s process on a host with `gpus` GPUs (module docstring)."""
    env = os.environ if env is None else env
    d = cfg.device_args
    index, processes, local = process_slot(cfg, rank, env)
    if d.gpu_mapping_file:
        slots = mapping_slots(d.gpu_mapping_file, d.gpu_mapping_key)
        if len(slots) != processes:
            raise ConfigError(
                f"device_args.gpu_mapping_file: {d.gpu_mapping_file}'s {d.gpu_mapping_key} places "
                f"{len(slots)} processes, and {processes} share it here (FedML's rule: one slot per process)"
            )
        gpu = slots[index][1]
    elif local is not None:
        gpu = local
    elif rank == 0 or processes == 1:
        gpu = d.gpu_id
    else:
        gpu = rank - 1
    if gpu >= gpus and d.gpu_mapping_file:
        raise ConfigError(
            f"device_args.gpu_mapping_file: GPU {gpu} for process {index}, but this host has {gpus}"
        )
    return gpu % gpus
