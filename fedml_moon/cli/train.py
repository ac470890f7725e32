"""`fedml-moon simulate` and `fedml-moon run`: a config's run, in the standalone simulation, or as one
process (server or silo) of a distributed run: the MPI simulation under `mpirun`, or cross-silo."""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedml_moon.cli.common import add_run_options, add_verbose, setup_logging
from fedml_moon.errors import ConfigError
from fedml_moon.records.folder import claim_folder, running
from fedml_moon.run_folder import OUTPUTS

if TYPE_CHECKING:
    from fedml_moon.config.load import Config

log = logging.getLogger("fedml_moon")


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser)
    add_verbose(parser)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser)
    add_verbose(parser)
    parser.add_argument("--rank", type=int, help="0 for the server, 1..N for the silos (MPI: from mpirun)")
    parser.add_argument("--role", choices=("server", "client"), help="must agree with --rank (FedML's style)")


def start(args: argparse.Namespace) -> int:
    """Load the config, then run it here (standalone) or as this process of a distributed run."""
    # imported here, PyTorch with it: a command that loads no config (sweep --status, report) imports none
    from fedml_moon.config.load import load_config

    cfg = load_config(args.cf, args.overrides)
    _check_command(args.command, cfg)
    out_dir = _output_dir(args, cfg)
    if cfg.comm_args.backend != "sp":
        return _distributed(args, cfg, out_dir)
    from fedml_moon.adapters.run import simulate

    with running(out_dir):
        if not args.resume:
            claim_folder(out_dir, args.overwrite)
        summary = simulate(cfg, out_dir, resume=bool(args.resume))
    _report(summary, out_dir)
    return 0


def default_output_dir(cfg: Config) -> Path:
    name = f"{cfg.train_args.algorithm}-{cfg.data_args.dataset}"
    if cfg.comm_args.backend == "sp":
        return Path(OUTPUTS) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(OUTPUTS) / f"{name}-{cfg.comm_args.run_id}"  # the same folder for every process


def _mpi() -> tuple[object, int, int]:
    try:
        from mpi4py import MPI
    except ImportError:
        raise ConfigError(
            "comm_args.backend: MPI needs mpi4py and an MPI runtime (bash run/setup.sh installs both)"
        ) from None
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def _rank_of(args: argparse.Namespace, cfg: Config) -> tuple[int, int | None, object, object]:
    """(rank, size, comm, place in a hierarchical silo's group under mpirun) of this process."""
    if cfg.comm_args.backend == "MPI":
        comm, rank, size = _mpi()
        if size < 2:
            raise ConfigError(
                "comm_args.backend: MPI runs under mpirun with 2 or more ranks: mpirun -np W+1 fedml-moon ..."
            )
        if getattr(args, "rank", None) not in (None, rank):
            raise ConfigError(
                f"--rank {args.rank} disagrees with mpirun's rank {rank}; leave --rank out under MPI"
            )
        if cfg.common_args.scenario == "hierarchical" and cfg.common_args.training_type == "cross_silo":
            from fedml_moon.distributed.silo.mpi_groups import split

            servers, rank, size, placed = split(comm, cfg)  # the server's and leaders' comm
            return rank, size, servers, placed
        return rank, size, comm, None
    if args.rank is None or args.rank < 0:
        raise ConfigError(
            f"--rank: {cfg.comm_args.backend} processes are started one by one; give --rank (0 = server)"
        )
    return args.rank, None, None, None


def mpi_ranks(argv: list[str]) -> int:
    """How many MPI ranks `fedml-moon ARGV` needs (run/mpirun.sh without NP): a cross-silo run over
    MPI has one silo per party plus the server, train_args.client_num_in_total + 1 after --set (a
    hierarchical one N x P + 1: `mpi_groups`)."""
    from fedml_moon.cli import build_parser

    args = build_parser().parse_args(argv)
    if args.command != "run":
        raise ConfigError(
            f"`{args.command}` under mpirun: give the number of ranks, e.g. 3 (a server, 2 workers)"
        )
    from fedml_moon.config.load import load_config

    cfg = load_config(args.cf, args.overrides)
    if (cfg.common_args.training_type, cfg.comm_args.backend) != ("cross_silo", "MPI"):
        raise ConfigError(
            f"{args.cf}: training_type {cfg.common_args.training_type} / backend {cfg.comm_args.backend} "
            "does not run under mpirun; cross-silo over MPI needs cross_silo / MPI"
        )
    if cfg.common_args.scenario == "hierarchical":
        from fedml_moon.distributed.silo.mpi_groups import group_size

        return cfg.train_args.client_num_in_total * group_size(cfg) + 1
    return cfg.train_args.client_num_in_total + 1


def _check_command(command: str, cfg: Config) -> None:
    kind = cfg.common_args.training_type
    if command == "simulate" and kind != "simulation":
        raise ConfigError("common_args.training_type: cross_silo processes are started with `fedml-moon run`")
    if command == "run" and kind != "cross_silo":
        raise ConfigError("common_args.training_type: simulations are started with `fedml-moon simulate`")


def _group_process(cfg: Config, rank: int, placed: object) -> int | None:
    """This process's rank in its hierarchical silo's group (mpirun's placement or torchrun's RANK)."""
    if cfg.common_args.scenario != "hierarchical" or rank == 0:
        return None
    if placed is not None:
        return int(placed.rank)
    return int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None


def _distributed(args: argparse.Namespace, cfg: Config, out_dir: Path) -> int:
    from fedml_moon.distributed.deploy import explicit_keys, run_process

    rank, size, comm, placed = _rank_of(args, cfg)
    if getattr(args, "role", None) and args.role != ("server" if rank == 0 else "client"):
        raise ConfigError(f"--role {args.role} disagrees with rank {rank} (rank 0 is the server)")
    setup_logging(args.verbose, rank, _group_process(cfg, rank, placed))
    explicit = explicit_keys(args.overrides, cfg)  # a silo's own --set must agree with the server's
    resume = bool(args.resume)
    if rank == 0 and not resume:  # the server writes the run's records
        claim_folder(out_dir, args.overwrite)
    status = run_process(cfg, out_dir, rank, size, comm, resume, explicit, placed, bool(args.overwrite))
    log.info("rank %d finished: %s", rank, status)
    if rank != 0:  # a silo's files are written: its exit skips the teardown that can abort it
        from fedml_moon.distributed.silo.group import end_at_exit

        end_at_exit()
    return {"completed": 0, "refused": 2}.get(status, 1)  # refused: a site refused its own data


def _output_dir(args: argparse.Namespace, cfg: Config) -> Path:
    if args.resume:
        if args.output_dir and Path(args.output_dir).resolve() != Path(args.resume).resolve():
            raise ConfigError(
                "--resume DIR continues the run in DIR; leave --output-dir out (or give the same)"
            )
        if args.overwrite:
            raise ConfigError(
                "--resume DIR goes on with the run in DIR; --overwrite would remove it: give one"
            )
        return Path(args.resume)
    return Path(args.output_dir) if args.output_dir else default_output_dir(cfg)


def _report(summary: dict, out_dir: Path) -> None:
    acc = summary.get("final_test_acc")
    log.info(
        "done: final_test_acc %s, best_test_acc %s (round %s), %.1f s; results in %s",
        f"{acc:.4f}" if acc is not None else "n/a",
        f"{summary['best_test_acc']:.4f}" if summary.get("best_test_acc") is not None else "n/a",
        summary.get("best_round"),
        summary.get("total_time_s", 0.0),
        out_dir,
    )
