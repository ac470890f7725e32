"""One process of a distributed run: the server (rank 0) or a worker / silo (rank >= 1).

Modes (`common_args.training_type` x `comm_args.backend`):
  simulation + MPI       MPI simulation: W = size - 1 workers simulate N parties, party p on rank
                         1 + p % W (a fixed map: a party's state and data never leave its worker)
  cross_silo + MPI       one process per silo: party p is rank p + 1 (W = N); hierarchical silos:
                         P processes each, the leaders ranked as silos (silo/mpi_groups.py)
  cross_silo + GRPC      the same over gRPC; the server's address from the ipconfig CSV (its rank-0 row)
  cross_silo + MQTT_S3   the same over an MQTT broker and an S3-compatible store
The run's config is the server's: a worker builds its data and parties from the shared settings the
server's WELCOME hands it (see managers.py), so every process loads and partitions the data identically
from the seed; the server keeps the test set for the global model, each worker its parties' loaders.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
from pathlib import Path
from typing import Any

from fedml_moon.adapters import compat
from fedml_moon.adapters.run import build_args, build_base, build_runner, build_server, held_claims
from fedml_moon.config.files import DIGEST_KEYS, file_digests
from fedml_moon.config.load import Config, config_from_dict, config_to_dict, parse_overrides
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.state import make_store
from fedml_moon.distributed.managers import config_differences
from fedml_moon.distributed.run_identity import server_run
from fedml_moon.distributed.silo.group import (
    Channel,
    Group,
    ending,
    follow,
    join,
    lead,
    leave,
    prepare_batchnorm,
)
from fedml_moon.distributed.silo.mpi_groups import Placement
from fedml_moon.engine.resume import Holding, check_resumable, flat_config, restore, resume_round
from fedml_moon.run_folder import RunFolder

log = logging.getLogger(__name__)
PARTY_KEYS = (
    "common_args.random_seed",
    "data_args",
    "model_args",
    "train_args",
    "algorithm_args",
    "privacy_args",
)
# a silo's own: where its data are, the code that reads them, where it keeps its state
LOCAL_KEYS = {"data_args.data_cache_dir", "data_args.download", "data_args.plugin", "train_args.state_store"}


def shared_config(cfg: Config) -> dict[str, Any]:
    """The settings every process of a run must agree on, as dotted keys (a silo's data folder and
    state store are its own business), with the digest of each file they name (`file_digests`)."""
    full = config_to_dict(cfg)
    out: dict[str, Any] = {}
    for key in PARTY_KEYS:
        section, _, name = key.partition(".")
        values = {name: full[section][name]} if name else full[section]
        out.update({f"{section}.{k}": v for k, v in values.items() if f"{section}.{k}" not in LOCAL_KEYS})
    out.update(file_digests(out))  # the files its settings name: another file under a path differs too
    return out


def with_shared(cfg: Config, shared: dict[str, Any]) -> Config:
    """`cfg` (a worker's own config) with the run's shared settings (the server's `shared_config`) in
    place of its own; its local settings (comm_args, device, data folder, state store, W&B) stay."""
    full = config_to_dict(cfg)
    full["algorithm_args"] = {}  # the server's algorithm decides which options exist
    shared = {k: v for k, v in shared.items() if k not in DIGEST_KEYS}  # this process's own files' say
    foreign = sorted(
        k for k in shared if k in LOCAL_KEYS or not any(k == s or k.startswith(f"{s}.") for s in PARTY_KEYS)
    )
    if foreign:  # e.g. common_args.plugins: what this process loads is its own business
        raise ConfigError(f"the server sent settings a silo never takes from it: {foreign[:10]}")
    for key, value in shared.items():
        section, _, name = key.partition(".")
        full.setdefault(section, {})[name] = value
    merged = config_from_dict(full)
    merged.passthrough = cfg.passthrough
    return merged


def explicit_keys(overrides: list[str], cfg: Config) -> list[str]:
    """The shared settings among a process's own `--set` overrides (they must agree with the server's)."""
    shared = shared_config(cfg)
    return sorted(
        f"{section}.{key}"
        for section, values in parse_overrides(overrides).items()
        for key in values
        if f"{section}.{key}" in shared
    )


def placement(cfg: Config, workers: int) -> dict[int, int]:
    """party -> rank: the MPI simulation spreads parties round-robin, cross-silo has one per silo."""
    n = cfg.train_args.client_num_in_total
    if cfg.common_args.training_type == "cross_silo":
        if workers != n:  # over MPI, mpirun's -np decides
            raise ConfigError(
                f"train_args.client_num_in_total: cross-silo runs one silo per party, so {n} parties need "
                f"{n} silos; mpirun started {workers} (use mpirun -np {n + 1}, or set "
                f"client_num_in_total: {workers})"
            )
        return {p: p + 1 for p in range(n)}
    if workers < 1:
        raise ConfigError("the MPI simulation needs at least one worker: mpirun -np 2 or more")
    return {p: 1 + p % workers for p in range(n)}


def read_ipconfig(path: str) -> dict[int, tuple[str, int, str]]:
    """rank -> (grpc_server_ip, grpc_server_port, ingress_ip) from FedML 0.9.6's ipconfig CSV. Only the
    server's row (rank 0) is used: silos dial it; rows of other ranks may be there (FedML's layout)."""
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
    """Workers of this run: MPI's size - 1, else one silo per party (train_args.client_num_in_total)."""
    if cfg.comm_args.backend == "MPI":
        return int(size) - 1
    return cfg.train_args.client_num_in_total


def frame_limit(cfg: Config, model: Any) -> int:
    """The largest message the server takes from a silo, in bytes: `comm_args.max_message_mb`, or by
    default four times the model's tensor bytes plus 1 MB (an upload is the model and, for SCAFFOLD,
    its control variate; LG-FedAvg's report its local layers), at least 8 MB."""
    if cfg.comm_args.max_message_mb is not None:
        return int(cfg.comm_args.max_message_mb * 1024 * 1024)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return max(8 << 20, 4 * nbytes + (1 << 20))


def make_transport(
    cfg: Config, rank: int, workers: int, comm: Any = None, max_frame_bytes: int | None = None
) -> Any:
    """The plugin's transport for `comm_args.backend` (see fedml_moon.distributed.transport); the server's
    refuses frames over `max_frame_bytes` (gRPC, MQTT + S3) before reading them."""
    c = cfg.comm_args
    if c.backend == "MPI":
        from fedml_moon.distributed.transport.mpi import MpiTransport

        return MpiTransport(comm, rank)
    if c.backend == "GRPC":
        from fedml_moon.distributed.transport.grpc_transport import GrpcClientTransport, GrpcServerTransport
        from fedml_moon.distributed.transport.policy import grpc_security

        table = read_ipconfig(c.grpc_ipconfig_path)
        ip, port, ingress = table[0]
        if rank == 0:
            if ip in ("0.0.0.0", "::", "") and not c.bind_all:
                raise ConfigError(
                    f"comm_args.grpc_ipconfig_path: the server's row binds to {ip!r}, every interface; give "
                    "the address to listen on, or set comm_args.bind_all: true"
                )
            security = grpc_security(c, 0, ip)
            return GrpcServerTransport(
                ip,
                port,
                c.grpc_max_message_mb,
                workers,
                security,
                max_frame_bytes,
                receive_timeout_s=c.receive_timeout_s,
                receive_window_kb=c.receive_window_kb,
            )
        security = grpc_security(c, rank, ingress)
        return GrpcClientTransport(rank, f"{ingress}:{port}", c.grpc_max_message_mb, c.timeout_s, security)
    from fedml_moon.distributed.transport.mqtt_s3 import MqttS3Transport, ensure_bucket
    from fedml_moon.distributed.transport.policy import mqtt_security

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
        max_frame_bytes=max_frame_bytes or 1 << 30,
    )


@dataclasses.dataclass
class DistributedProcess:
    """A built server or worker, ready for `run()` (FedMLRunner's algorithm_flow)."""

    manager: Any
    rank: int
    rounds: Any = None  # the server's ServerRounds
    status: str = "failed"
    on_exit: Any = None  # a hierarchical silo's leader: tells its group the run is over
    port: Any = None  # the server's status port (tracking_args.status_port)

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
                self._finish(status)
            self.status = status
            if self.port is not None:
                self.port.stop()
            if self.on_exit is not None:
                self.on_exit(status)

    def _finish(self, status: str) -> None:
        """The server's records of the run's end; a run that never began (no round of a new run ran:
        its sites never all ready) records nothing, so that the same command starts it again."""
        if self.manager.state.round.round_idx < 0 and self.manager.settings.start == 0:
            log.warning(
                "the run never began (%s before its first round): nothing is recorded, so the same command "
                "starts it again",
                status,
            )
            return
        self.rounds.finish(status)


def build_process(
    cfg: Config,
    out_dir: Path,
    rank: int,
    size: int | None = None,
    comm: Any = None,
    local_procs: int = 1,
    resume: bool = False,
    explicit: list[str] | None = None,
    group: Group | None = None,
    overwrite: bool = False,
) -> DistributedProcess:
    """Build rank `rank` of a distributed run (the server writes the run records to `out_dir`, a
    worker its own files to `out_dir/rank-<rank>`). With `resume` the server goes on from its newest
    checkpoint and tells the workers which of theirs to load. `explicit`: the shared settings this
    process was given with --set (a worker's must agree with the server's). `group`: a hierarchical
    silo's leader (`silo/group.py`)."""
    workers = worker_count(cfg, size)
    folder = out_dir if rank == 0 else RunFolder(out_dir).rank(rank).root
    if rank != 0:
        return _build_worker(
            cfg, folder, rank, size, comm, local_procs, list(explicit or []), group, overwrite
        )
    if resume and rank == 0:
        check_resumable(folder, cfg)  # no checkpoint, another config: say so before anything is overwritten
    base = build_base(cfg, folder, rank, local_procs, role="server")
    base.args.rank = rank
    # built (FedML's aggregator imported, a checkpoint loaded) before the transport listens: a server
    # that listens while it builds sends no heartbeat, and its silos' comm_args.timeout_s runs
    rounds = build_server(base)
    core = buffered_rounds(cfg, rounds)  # its state is in the server's checkpoint
    start = _resume_server(rounds, folder) if resume else 0
    from fedml_moon.status.http import open_port

    port = open_port(cfg, folder)  # refused (taken, no credentials) before the transport listens
    transport = make_transport(cfg, rank, workers, comm, frame_limit(cfg, base.model))
    ranks, run = list(range(1, workers + 1)), server_run(folder, resume)  # the run's identity, in WELCOMEs
    manager = server_manager(cfg, base.args, transport, rounds, ranks, start, core, run)
    return DistributedProcess(manager, rank, rounds, port=port)


def server_manager(
    cfg: Config,
    args: Any,
    transport: Any,
    rounds: Any,
    ranks: list[int],
    start: int = 0,
    core: Any = None,
    run: str | None = None,
) -> Any:
    """The server's manager of `cfg`'s run over `transport`: its workers `ranks`, the first round of
    this process `start` (a resumed run's), `core` the buffered rounds of `server_args.aggregation:
    buffered` (`buffered_rounds`), `run` the run's identity (`run_identity.server_run`)."""
    from fedml_moon.distributed.server.manager import ServerManager
    from fedml_moon.distributed.server.state import RunSettings

    settings = RunSettings(
        placement=placement(cfg, len(ranks)),
        workers=list(ranks),
        config=shared_config(cfg),
        comm=cfg.comm_args,
        checkpoint_every=cfg.train_args.checkpoint_every,
        full_config=flat_config(cfg),
        start=start,
        secure=bool(rounds.secure),  # privacy_args.secure_aggregation
        run=run,
    )
    return ServerManager(args, transport, rounds, settings, core)


def buffered_rounds(cfg: Config, rounds: Any) -> Any:
    """With `server_args.aggregation: buffered`, the server's `BufferedRounds` (on the simulated clock
    in the MPI simulation, at the parties' real pace otherwise); None for a synchronous run."""
    if cfg.server_args.aggregation != "buffered":
        return None
    from fedml_moon.engine.buffer_rounds import BufferedRounds
    from fedml_moon.engine.buffered import make_clock

    clock = make_clock(cfg, True) if cfg.common_args.training_type == "simulation" else None
    return BufferedRounds(rounds, cfg, clock)


def _worker_build(
    cfg: Config,
    folder: Path,
    rank: int,
    size: int | None,
    local_procs: int,
    args: Any,
    store: Any,
    group: Group | None = None,
):
    """A worker's `build(shared)`: its data and parties from the run's shared settings."""

    def build(shared: dict[str, Any]) -> Any:
        from fedml_moon.distributed.silo.refusal import held_data_digest
        from fedml_moon.distributed.silo.state import Built

        run_cfg = with_shared(cfg, shared)
        taken = config_differences(shared_config(cfg), shared)
        if taken:
            log.info("rank %d takes %d settings from the server: %s", rank, len(taken), ", ".join(taken))
        base = build_base(run_cfg, folder, rank, local_procs, args=args, role="silo")
        base.args.rank = rank
        if group is not None:
            prepare_batchnorm(base.model, group)
        parties = parties_of(run_cfg, size, rank)
        claims = held_claims(base)
        return Built(
            build_runner(base, store),
            parties,
            shared_config(run_cfg),
            run_cfg,
            {p: claims[p] for p in parties},
            held_data_digest(base.fed, parties),
        )

    return build


def run_follower(cfg: Config, out_dir: Path, rank: int, group: Group, size: int | None = None) -> str:
    """A hierarchical silo's process other than its leader: builds and trains what the leader
    broadcasts, in its own folder (out_dir/rank-R/process-k), until the leader says stop."""
    own = RunFolder(out_dir).rank(rank).process(group.rank)
    args = build_args(cfg, own.root, rank, group.local_size)
    store = make_store(cfg.train_args.state_store, own.party_state)
    return follow(
        _worker_build(cfg, own.root, rank, size, group.local_size, args, store, group), Channel(), group
    )


def _build_worker(
    cfg: Config,
    folder: Path,
    rank: int,
    size: int | None,
    comm: Any,
    local_procs: int,
    explicit: list[str],
    group: Group | None = None,
    overwrite: bool = False,
) -> DistributedProcess:
    """A worker or silo: its transport now; its data and parties when the server's WELCOME names the
    run's config (`with_shared`)."""
    # FedML's trainer (its algorithm frame: a second or more) imported before the transport dials: its
    # clock, comm_args.timeout_s for the server to answer, starts with it
    from fedml_moon.adapters import trainer  # noqa: F401
    from fedml_moon.distributed.silo.manager import SiloManager
    from fedml_moon.distributed.silo.state import Local
    from fedml_moon.status.http import open_site_port

    port = open_site_port(cfg, folder, rank)  # refused before the transport dials
    transport = make_transport(cfg, rank, worker_count(cfg, size), comm)
    args = build_args(cfg, folder, rank, local_procs)
    store = make_store(cfg.train_args.state_store, RunFolder(folder).party_state)
    expected = parties_of(cfg, size, rank)
    local = Local(
        shared_config(cfg), explicit, expected, lambda: [p for p in expected if p not in store], overwrite
    )
    build, on_exit = _worker_build(cfg, folder, rank, size, local_procs, args, store, group), None
    if group is not None:  # a hierarchical silo's leader: its group builds and trains with it
        channel = Channel()
        build, on_exit = lead(build, channel, group), ending(channel)
    manager = SiloManager(args, transport, local, build, rank, cfg.comm_args, folder, server_address(cfg))
    return DistributedProcess(manager, rank, on_exit=on_exit, port=port)


def parties_of(cfg: Config, size: int | None, rank: int) -> list[int]:
    """The parties worker `rank` holds under `cfg` (see `placement`)."""
    return [p for p, r in placement(cfg, worker_count(cfg, size)).items() if r == rank]


def server_address(cfg: Config) -> str:
    """Where a silo finds its server, for its log lines ("" under MPI)."""
    c = cfg.comm_args
    if c.backend == "GRPC":
        ip, port, ingress = read_ipconfig(c.grpc_ipconfig_path)[0]
        return f"{ingress}:{port}"
    if c.backend == "MQTT_S3":
        return f"the MQTT broker {c.mqtt_host}:{c.mqtt_port}"
    return ""


def _resume_server(rounds: Any, folder: Path) -> int:
    """Load the server's newest checkpoint (its config was checked by `check_resumable` before
    anything was built); returns the first round to run."""
    round_idx = resume_round(folder)
    log.info("resuming after the checkpoint of round %d", round_idx)
    return restore(folder, round_idx, Holding(server=rounds))


def run_process(
    cfg: Config,
    out_dir: Path,
    rank: int,
    size: int | None = None,
    comm: Any = None,
    resume: bool = False,
    explicit: list[str] | None = None,
    placed: Placement | None = None,
    overwrite: bool = False,
) -> str:
    """Build and run one process through FedML's `FedMLRunner(..., algorithm_flow=...)`; its status.
    `placed`: this process's place in a hierarchical silo's group under mpirun (`comm` is then the
    server's and leaders' communicator, None for the group's other processes)."""
    local_procs = 1
    if comm is not None:
        from mpi4py import MPI

        local_procs = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    group = join(cfg, rank, placed)  # a hierarchical silo's group, or None
    try:
        if group is not None:
            local_procs = group.local_size
            if not group.leader:
                return run_follower(cfg, Path(out_dir), rank, group, size)
        proc = build_process(
            cfg, Path(out_dir), rank, size, comm, local_procs, resume, explicit, group, overwrite
        )
        compat.run_flow(proc, RunFolder(out_dir).fedml_home, proc.manager.args)
        return proc.status
    finally:
        leave(group)
