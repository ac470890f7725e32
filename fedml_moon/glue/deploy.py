"""One process of a distributed run: the server (rank 0) or a worker / silo (rank >= 1).

Modes (`common_args.training_type` x `comm_args.backend`):
  simulation + MPI       MPI simulation: W = size - 1 workers simulate N parties, party p on rank
                         1 + p % W (a fixed map: a party's state and data never leave its worker)
  cross_silo + MPI       one process per silo: party p is rank p + 1 (W = N)
  cross_silo + GRPC      the same over gRPC; ranks and the server's address from the ipconfig CSV
  cross_silo + MQTT_S3   the same over an MQTT broker and an S3-compatible store
Every process loads and partitions the data identically from the seed; the server keeps the test set
for the global model, each worker its parties' loaders.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
from pathlib import Path
from typing import Any

from fedml_moon.config import Config, config_to_dict
from fedml_moon.config_schema import ConfigError
from fedml_moon.core.checkpoint import read_checkpoint
from fedml_moon.glue.resume import check_config, check_resumable, checkpoint_root, flat_config, resume_round
from fedml_moon.glue.run import build_base, build_runner, build_server

log = logging.getLogger(__name__)
PARTY_KEYS = ("common_args.random_seed", "data_args", "model_args", "train_args", "algorithm_args")
LOCAL_KEYS = {"data_args.data_cache_dir", "data_args.download", "train_args.state_store"}


def shared_config(cfg: Config) -> dict[str, Any]:
    """The settings every process of a run must agree on, as dotted keys (a silo's data folder and
    state store are its own business)."""
    full = config_to_dict(cfg)
    out: dict[str, Any] = {}
    for key in PARTY_KEYS:
        section, _, name = key.partition(".")
        values = {name: full[section][name]} if name else full[section]
        out.update({f"{section}.{k}": v for k, v in values.items() if f"{section}.{k}" not in LOCAL_KEYS})
    return out


def placement(cfg: Config, workers: int) -> dict[int, int]:
    """party -> rank: the MPI simulation spreads parties round-robin, cross-silo has one per silo."""
    n = cfg.train_args.client_num_in_total
    if cfg.common_args.training_type == "cross_silo":
        if workers != n:
            raise ConfigError(
                f"train_args.client_num_in_total: cross-silo runs one silo per party, so {n} parties need "
                f"{n} silos; this run has {workers} (start {n} silo ranks, or set "
                f"client_num_in_total: {workers})"
            )
        return {p: p + 1 for p in range(n)}
    if workers < 1:
        raise ConfigError("the MPI simulation needs at least one worker: mpirun -np 2 or more")
    return {p: 1 + p % workers for p in range(n)}


def read_ipconfig(path: str) -> dict[int, tuple[str, int, str]]:
    """rank -> (grpc_server_ip, grpc_server_port, ingress_ip) from FedML 0.9.6's ipconfig CSV."""
    with open(Path(path).expanduser(), newline="") as fh:
        rows = list(csv.DictReader(fh))
    need = {"eid", "rank", "grpc_server_ip", "grpc_server_port"}
    if not rows or not need <= set(rows[0]):
        raise ConfigError(
            f"comm_args.grpc_ipconfig_path: {path} needs the header eid,rank,grpc_server_ip,grpc_server_port"
            ",ingress_ip (FedML 0.9.6's; ingress_ip may be empty)"
        )
    out = {}
    for row in rows:
        ip, port = row["grpc_server_ip"].strip(), int(row["grpc_server_port"])
        out[int(row["rank"])] = (ip, port, (row.get("ingress_ip") or "").strip() or ip)
    if 0 not in out:
        raise ConfigError(f"comm_args.grpc_ipconfig_path: {path} has no row for the server (rank 0)")
    return out


def worker_count(cfg: Config, size: int | None) -> int:
    """Workers of this run: MPI's size - 1, the silo rows of the ipconfig, or N (MQTT_S3)."""
    backend = cfg.comm_args.backend
    if backend == "MPI":
        return int(size) - 1
    if backend == "GRPC":
        return len(read_ipconfig(cfg.comm_args.grpc_ipconfig_path)) - 1
    return cfg.train_args.client_num_in_total


def make_transport(cfg: Config, rank: int, workers: int, comm: Any = None) -> Any:
    """The plugin's transport for `comm_args.backend` (see fedml_moon.glue.transport)."""
    c = cfg.comm_args
    if c.backend == "MPI":
        from fedml_moon.glue.transport.mpi import MpiTransport

        return MpiTransport(comm, rank)
    if c.backend == "GRPC":
        from fedml_moon.glue.transport.grpc_transport import GrpcClientTransport, GrpcServerTransport
        from fedml_moon.glue.transport.policy import grpc_security

        table = read_ipconfig(c.grpc_ipconfig_path)
        ip, port, ingress = table[0]
        if rank == 0:
            if ip in ("0.0.0.0", "::", "") and not c.bind_all:
                raise ConfigError(
                    f"comm_args.grpc_ipconfig_path: the server's row binds to {ip!r}, every interface; give "
                    "the address to listen on, or set comm_args.bind_all: true"
                )
            return GrpcServerTransport(ip, port, c.grpc_max_message_mb, workers, grpc_security(c, 0, ip))
        if rank not in table:
            raise ConfigError(
                f"comm_args.grpc_ipconfig_path: rank {rank} has no row in {c.grpc_ipconfig_path}"
            )
        security = grpc_security(c, rank, ingress)
        return GrpcClientTransport(rank, f"{ingress}:{port}", c.grpc_max_message_mb, c.timeout_s, security)
    from fedml_moon.glue.transport.mqtt_s3 import MqttS3Transport, ensure_bucket
    from fedml_moon.glue.transport.policy import mqtt_security

    if rank == 0:
        ensure_bucket(c.s3_endpoint, c.s3_bucket, c.s3_region)
    return MqttS3Transport(
        rank,
        c.run_id,
        host=c.mqtt_host,
        port=c.mqtt_port,
        s3_endpoint=c.s3_endpoint,
        bucket=c.s3_bucket,
        region=c.s3_region,
        inline_kb=c.mqtt_inline_kb,
        timeout_s=c.timeout_s,
        security=mqtt_security(c, rank),
    )


@dataclasses.dataclass
class DistributedProcess:
    """A built server or worker, ready for `run()` (FedMLRunner's algorithm_flow)."""

    manager: Any
    rank: int
    rounds: Any = None  # the server's ServerRounds
    status: str = "failed"

    def run(self) -> None:
        status = "failed"
        try:
            self.manager.run()
            status = self.manager.status
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            if self.rounds is not None and not self.rounds.summary:
                self.rounds.finish(status)
            self.status = status


def build_process(
    cfg: Config,
    out_dir: Path,
    rank: int,
    size: int | None = None,
    comm: Any = None,
    local_procs: int = 1,
    resume: bool = False,
) -> DistributedProcess:
    """Build rank `rank` of a distributed run (the server writes the run records to `out_dir`, a
    worker its own files to `out_dir/rank-<rank>`). With `resume` the server goes on from its newest
    checkpoint and tells the workers which of theirs to load."""
    from fedml_moon.glue.client_manager import PluginClientManager
    from fedml_moon.glue.server_manager import PluginServerManager

    workers = worker_count(cfg, size)
    where = placement(cfg, workers)
    folder = out_dir if rank == 0 else out_dir / f"rank-{rank}"
    if resume and rank == 0:
        check_resumable(folder, cfg)  # no checkpoint, another config: say so before anything is overwritten
    base = build_base(cfg, folder, rank, local_procs)
    base.args.rank = rank
    transport = make_transport(cfg, rank, workers, comm)
    shared = shared_config(cfg)
    if rank == 0:
        rounds = build_server(base, folder)
        start = _resume_server(rounds, cfg, folder) if resume else 0
        ranks = list(range(1, workers + 1))
        ckpt = (cfg.train_args.checkpoint_every, flat_config(cfg))
        manager = PluginServerManager(
            base.args, transport, rounds, where, ranks, shared, cfg.comm_args, ckpt, start
        )
        return DistributedProcess(manager, rank, rounds)
    parties = [p for p, r in where.items() if r == rank]
    runner = build_runner(base, folder)
    ckpt_dir = checkpoint_root(folder)
    manager = PluginClientManager(
        base.args, transport, runner, parties, rank, shared, cfg.comm_args, ckpt_dir
    )
    return DistributedProcess(manager, rank)


def _resume_server(rounds: Any, cfg: Config, folder: Path) -> int:
    """Load the server's newest checkpoint; returns the first round to run."""
    round_idx = resume_round(folder)
    saved = read_checkpoint(checkpoint_root(folder), round_idx, ("config", "server"))
    check_config(saved["config"], cfg, folder)
    log.info("resuming after the checkpoint of round %d", round_idx)
    return rounds.load_state(saved["server"])


def run_process(
    cfg: Config, out_dir: Path, rank: int, size: int | None = None, comm: Any = None, resume: bool = False
) -> str:
    """Build and run one process through FedML's `FedMLRunner(..., algorithm_flow=...)`; its status."""
    import fedml

    local_procs = 1
    if comm is not None:
        from mpi4py import MPI

        local_procs = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    proc = build_process(cfg, Path(out_dir), rank, size, comm, local_procs, resume)
    base_args = proc.manager.args
    fedml.FedMLRunner(base_args, None, None, None, algorithm_flow=proc).run()
    return proc.status
