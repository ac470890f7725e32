"""A silo made of several processes (FedML's hierarchical cross-silo, `common_args.scenario:
hierarchical`): `torchrun` starts the group on one or more hosts (or mpirun starts the whole job:
`silo/mpi_groups.py`), its processes form one torch.distributed process group (gloo on CPUs, nccl on GPUs),
and only the group's rank 0, the leader, talks to the server. The leader hands the group every
piece of work that changes a party (the run's config once, each round's training, a party state to
load) through `Channel`, a broadcast of the codec's bytes (safetensors + JSON: nothing is
un-pickled), and the group trains it data-parallel (`engine.data_parallel`): each step's batch
split across the processes, gradients summed, BatchNorm's statistics over the whole batch
(`engine.sync_batchnorm`). The followers hold the same party states as the leader, step for step;
the leader alone evaluates, checkpoints and uploads.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedml_moon.config.load import Config
from fedml_moon.core.codec import decode, encode
from fedml_moon.distributed.silo.mpi_groups import Placement
from fedml_moon.engine import sync_batchnorm
from fedml_moon.engine.data_parallel import DataParallel, active
from fedml_moon.errors import ConfigError

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Group:
    """This process in its silo's group: its rank there, the group's size, and this host's processes."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    sync_batchnorm: bool = True  # the leader's device_args.sync_batchnorm, for the whole group

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def data_parallel(self) -> DataParallel:
        return DataParallel(self.rank, self.size, sync_batchnorm=self.sync_batchnorm)


def join(cfg: Config, silo_rank: int, placed: Placement | None = None) -> Group | None:
    """Form the silo's process group when `common_args.scenario` is hierarchical and this process is
    a silo (rank >= 1); None otherwise. `placed`: where mpirun put this process (`mpi_groups.split`);
    else torchrun's environment, refused, naming the keys, when torchrun did not start the group or
    its size is not `device_args.n_node_in_silo` x `n_proc_per_node`, and a server or one-process
    silo that torchrun started several times (each would act as the whole rank)."""
    if cfg.common_args.scenario != "hierarchical" or silo_rank == 0:
        refuse_copies(cfg, silo_rank)
        return None
    placed = placed or torchrun_placement(cfg, silo_rank)
    import torch.distributed as dist

    from fedml_moon.adapters.run import select_device, uses_gpu

    die_with_parent()
    d = cfg.device_args
    cuda = uses_gpu(cfg)
    backend = group_backend(cuda)
    if cuda:  # nccl's collectives run on this process's own GPU
        torch.cuda.set_device(select_device(cfg, silo_rank))
    timeout = datetime.timedelta(seconds=max(60.0, 10 * cfg.comm_args.timeout_s))
    if placed.init_method is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(
            backend, init_method=placed.init_method, rank=placed.rank, world_size=placed.size, timeout=timeout
        )
    sync = torch.tensor([int(d.sync_batchnorm)])
    dist.broadcast(sync, src=0)  # one setting for the group: its leader's
    group = Group(dist.get_rank(), placed.size, placed.local_rank, placed.local_size, bool(sync.item()))
    log.info(
        "silo %d: process %d of %d (%s), pid %d", silo_rank, group.rank, group.size, backend, os.getpid()
    )
    return group


def leave(group: Group | None) -> None:
    """End this process's part of its silo's group (torch.distributed's process group) before the
    process exits: a gloo group left to the interpreter's exit can abort the process after its run
    completed ("terminate called without an active exception", exit -6, which fails its torchrun)."""
    global _left
    if group is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _left = True


_left = False


def end_at_exit() -> None:
    """A silo's process whose run ended (its files written, its final model saved): its exit, too,
    goes through `exit_if_left`, which skips the interpreter's teardown ("terminate called without an
    active exception", exit -6, seen in an MQTT + S3 silo under Python 3.12 after it completed)."""
    global _left
    _left = True


def exit_if_left(code: int) -> None:
    """End a process that was part of a silo's group at once, with `code`, its logs flushed: gloo's
    threads can still abort it in the interpreter's exit after its group was destroyed ("terminate
    called without an active exception", exit -6, seen under load). A rank of an mpirun job
    finalizes MPI first (mpirun ends a job whose rank exits without). The `fedml-moon` command and
    `python -m fedml_moon` call it (`cli.entry`)."""
    if not _left:
        return
    if "mpi4py.MPI" in sys.modules:  # a rank of an mpirun job: MPI finalized first, as at exit
        from fedml_moon.distributed.transport import mpi

        mpi.finalize()  # with no transport thread calling MPI then or after
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def group_backend(cuda: bool) -> str:
    """The group's torch.distributed backend: gloo on CPUs; on GPUs nccl for CUDA tensors (gradients,
    loss terms, BatchNorm's sums) and gloo for CPU tensors (the leader's broadcasts, `Channel`)."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def _torchrun_sizes() -> str:
    """The --set that make a silo's keys agree with the torchrun that started this process."""
    nodes, procs = os.environ.get("GROUP_WORLD_SIZE", "N"), os.environ.get("LOCAL_WORLD_SIZE", "P")
    return f"--set device_args.n_node_in_silo={nodes} --set device_args.n_proc_per_node={procs}"


def refuse_copies(cfg: Config, rank: int) -> None:
    """torchrun started several processes of a rank that is one process (the server, or a silo whose
    `common_args.scenario` is horizontal): refused, each would otherwise act as the whole rank."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if "TORCHELASTIC_RUN_ID" not in os.environ or size <= 1:
        return
    if rank == 0:
        raise ConfigError(
            f"torchrun started {size} processes of the server (rank 0), which is one process: start it "
            "without torchrun (only a hierarchical silo is a group)"
        )
    raise ConfigError(
        f"common_args.scenario is {cfg.common_args.scenario} (a silo is one process), but torchrun started "
        f"{size} processes of silo {rank}: add --set common_args.scenario=hierarchical {_torchrun_sizes()}, "
        "or start the silo without torchrun"
    )


def torchrun_placement(cfg: Config, silo_rank: int) -> Placement:
    """This process's place in its group, from torchrun's environment (checked against the config)."""
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise ConfigError(
            f"common_args.scenario: torchrun starts a hierarchical silo and sets {', '.join(missing)}"
            "; start the silo as torchrun --nnodes N --nproc-per-node P ... -m fedml_moon run ... (docs: "
            "how-to/deployment-modes.md), under mpirun with comm_args.backend: MPI, or set scenario: "
            "horizontal"
        )
    d = cfg.device_args
    size, expected = int(os.environ["WORLD_SIZE"]), d.n_node_in_silo * d.n_proc_per_node
    if size != expected:
        raise ConfigError(
            f"device_args.n_node_in_silo x n_proc_per_node is {d.n_node_in_silo} x {d.n_proc_per_node} = "
            f"{expected}, but torchrun started {size} processes for silo {silo_rank}; make them agree: "
            f"{_torchrun_sizes()}, or change torchrun's --nnodes / --nproc-per-node"
        )
    for key, env in (("pg_master_address", "MASTER_ADDR"), ("pg_master_port", "MASTER_PORT")):
        given = getattr(d, key)
        if given is not None and str(given) != os.environ[env]:
            raise ConfigError(
                f"device_args.{key} is {given!r}, but torchrun's {env} is {os.environ[env]!r}; make them "
                "agree (or leave the key null)"
            )
    local = int(os.environ["LOCAL_RANK"]), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return Placement(int(os.environ["RANK"]), size, *local)


def die_with_parent() -> None:
    """A group process ends (SIGTERM) when its torchrun dies, even by SIGKILL: torchrun starts each
    process in its own session, so a process left behind would go on as the silo beside the
    restarted group (its leader taking the silo's stream from the server). Linux only (prctl)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        log.warning("could not ask to end with torchrun (prctl errno %d)", ctypes.get_errno())
    elif os.getppid() != parent:  # torchrun died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def prepare_batchnorm(model: torch.nn.Module, group: Group) -> None:
    """A group splits each batch: the model's BatchNorm layers become `GroupBatchNorm`s, which take
    the whole batch's statistics (`device_args.sync_batchnorm`, the default) or their slice's."""
    count = sync_batchnorm.convert(model)
    if count:
        log.info(
            "silo group: %d BatchNorm layers take %s",
            count,
            "the whole batch's statistics" if group.sync_batchnorm else "their slice's statistics (DDP's)",
        )


class Channel:
    """The leader's broadcasts to its group: a command and its fields, as the codec's bytes."""

    def send(self, command: str, **fields: Any) -> None:
        data = torch.frombuffer(bytearray(encode({"command": command, **fields})), dtype=torch.uint8)
        self._broadcast(data)

    def receive(self) -> tuple[str, dict[str, Any]]:
        message = decode(self._broadcast(None).numpy().tobytes())
        return str(message.pop("command")), message

    @staticmethod
    def _broadcast(data: torch.Tensor | None) -> torch.Tensor:
        import torch.distributed as dist

        size = torch.tensor([0 if data is None else data.numel()], dtype=torch.int64)
        dist.broadcast(size, src=0)
        buffer = data if data is not None else torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buffer, src=0)
        return buffer


def _states_out(states: dict) -> dict:
    return {str(p): s for p, s in states.items()}


class GroupRunner:
    """The leader's PartyRunner: training and party states go to the whole group first."""

    def __init__(self, runner: Any, channel: Channel, group: Group) -> None:
        self.runner, self.channel, self.group = runner, channel, group

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def train_many(self, tasks: list, round_idx: int) -> list:
        self.channel.send("train", round=round_idx, tasks=[{"party": int(p), "payload": d} for p, d in tasks])
        with active(self.group.data_parallel()):
            return self.runner.train_many(tasks, round_idx)

    def load_state(self, states: dict) -> None:
        self.channel.send("load", states=_states_out(states))
        self.runner.load_state(states)


def lead(build: Callable[[dict], Any], channel: Channel, group: Group) -> Callable[[dict], Any]:
    """The leader's `build`: the group builds from the same shared config, and its runner leads."""

    def built(shared: dict) -> Any:
        channel.send("build", config=shared)
        out = build(shared)
        out.runner = GroupRunner(out.runner, channel, group)
        return out

    return built


def ending(channel: Channel) -> Callable[[str], None]:
    """The leader's last word to its group: stop after a completed run; after a failed one the
    leader just exits, and the group's next receive fails."""

    def end(status: str) -> None:
        if status == "completed":
            channel.send("stop", status=status)

    return end


def follow(build: Callable[[dict], Any], channel: Channel, group: Group) -> str:
    """A follower's whole life: do what the leader broadcasts until it says stop."""
    built = None
    while True:
        command, fields = channel.receive()
        if command == "stop":
            return str(fields.get("status", "completed"))
        if command == "build":
            built = build(fields["config"])
        elif command == "train" and built is not None:
            tasks = [(int(t["party"]), t["payload"]) for t in fields["tasks"]]
            with active(group.data_parallel()):
                built.runner.train_many(tasks, int(fields["round"]))
            log.info(
                "silo group process %d of %d: round %s trained on its slice of every batch",
                group.rank,
                group.size,
                fields["round"],
            )
        elif command == "load" and built is not None:
            built.runner.load_state(fields["states"])
        else:
            raise RuntimeError(f"silo group: {command!r} from the leader before the run's config")
