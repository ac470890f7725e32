"""Hierarchical silos under one mpirun (`common_args.scenario: hierarchical`, `comm_args.backend: MPI`).

Every silo of the job is a group of P = `device_args.n_node_in_silo` x `n_proc_per_node` processes,
so the job has 1 + N x P ranks (N = `train_args.client_num_in_total` silos). World rank 0 is the
server; world ranks 1 + (s - 1) P ... s P are silo s's processes, the first of them its leader.
The server and the leaders talk over a communicator of their own (the server its rank 0, silo s its
rank s: the plugin's MPI transport, unchanged); each silo's processes form a torch.distributed
group (`silo/group.py`'s `group_backend`) whose address the leader hands its group over MPI, as bytes
(nothing is un-pickled). The rest is the torchrun silo's (`silo/group.py`).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

from fedml_moon.config.load import Config
from fedml_moon.errors import ConfigError

ADDRESS_BYTES = 256


@dataclass(frozen=True)
class Placement:
    """Where a process of a silo's group stands: its rank in the group, the group's size, its rank
    among the group's processes on its host and their number, and the group's rendezvous
    (`tcp://host:port`; None: torchrun's environment)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    init_method: str | None = None


def group_size(cfg: Config) -> int:
    """P: the processes of each hierarchical silo."""
    return cfg.device_args.n_node_in_silo * cfg.device_args.n_proc_per_node


def layout(world_rank: int, world_size: int, cfg: Config) -> tuple[int, int]:
    """(silo, process in its group) of an mpirun rank; (0, 0) for the server. Refuses, naming the
    keys and the -np to give, a job whose size is not 1 + N x P."""
    p, n = group_size(cfg), cfg.train_args.client_num_in_total
    if world_size != 1 + n * p:
        raise ConfigError(
            f"common_args.scenario: hierarchical over MPI runs {n} silos (train_args.client_num_in_total)"
            f" of {p} processes (device_args.n_node_in_silo x n_proc_per_node) and the server: mpirun "
            f"-np {1 + n * p}, not {world_size}"
        )
    if world_rank == 0:
        return 0, 0
    return 1 + (world_rank - 1) // p, (world_rank - 1) % p


def split(comm: Any, cfg: Config) -> tuple[Any, int, int, Placement | None]:
    """(the server's and leaders' communicator, or None for the other group processes; this process's
    rank there, the silo's for a group process; that communicator's size; its place in its silo's
    group, None for the server). Collective over `comm` (every rank of the job calls it)."""
    from mpi4py import MPI

    silo, process = layout(comm.Get_rank(), comm.Get_size(), cfg)
    talks = process == 0
    servers = comm.Split(0 if talks else MPI.UNDEFINED, comm.Get_rank())
    group = comm.Split(silo if silo else MPI.UNDEFINED, comm.Get_rank())
    size = 1 + cfg.train_args.client_num_in_total
    if silo == 0:
        return servers, 0, size, None
    host = group.Split_type(MPI.COMM_TYPE_SHARED, key=process)
    placement = Placement(
        process, group.Get_size(), host.Get_rank(), host.Get_size(), _rendezvous(group, host, cfg, silo)
    )
    host.Free()
    group.Free()
    return (servers if talks else None), silo, size, placement


def _rendezvous(group: Any, host: Any, cfg: Config, silo: int) -> str:
    """The group's `tcp://address:port`, chosen by its leader and broadcast as JSON bytes: the
    address `device_args.pg_master_address`, else 127.0.0.1 when the whole group is on the leader's
    host, else the leader's host's address; the port `pg_master_port` + silo - 1 (one port per silo
    on a shared host), else a free port of the leader's host."""
    from mpi4py import MPI

    buf = bytearray(ADDRESS_BYTES)
    if group.Get_rank() == 0:
        d = cfg.device_args
        address = d.pg_master_address or (
            "127.0.0.1" if host.Get_size() == group.Get_size() else socket.gethostbyname(socket.gethostname())
        )
        port = int(d.pg_master_port) + silo - 1 if d.pg_master_port is not None else _free_port(address)
        data = json.dumps([address, port]).encode()
        buf[: len(data)] = data
    group.Bcast([buf, MPI.BYTE], root=0)
    address, port = json.loads(bytes(buf).rstrip(b"\0"))
    return f"tcp://{address}:{int(port)}"


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address if address != "0.0.0.0" else "", 0))
        return sock.getsockname()[1]
