"""`fedml-moon sweep FILE`: a grid of simulations, here or through a job scheduler (`--on`,
`--status`, `--wait`, the Slurm resources); the sweep on this machine is `sweep.run_sweep`, through a
scheduler `submit`."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedml_moon.cli.common import add_set
from fedml_moon.errors import ConfigError
from fedml_moon.results.cluster import EXECUTORS, SlurmArgs, slurm_args

if TYPE_CHECKING:
    from fedml_moon.results.sweep import Run

log = logging.getLogger(__name__)

# command-line flag -> the sweep file's `slurm:` key it overrides
RESOURCES = {
    "partition": ("partition", str, "the partition (queue)"),
    "account": ("account", str, "the account charged"),
    "qos": ("qos", str, "the quality of service"),
    "time": ("time", str, "time limit of each run: minutes, HH:MM:SS or D-HH:MM:SS"),
    "gpus": ("gpus_per_run", int, "GPUs of each run"),
    "cpus": ("cpus_per_run", int, "CPU cores of each run (also its PyTorch threads)"),
    "mem": ("mem_gb", float, "memory of each run in GB"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep file and its runs' options, then the scheduler's."""
    parser.add_argument("sweep_file", help="a sweep file: base config, grid, output folder")
    parser.add_argument(
        "--jobs",
        type=int,
        help="runs at a time (default 1; threads per run: cores / jobs); with --on slurm: the array's %%N",
    )
    parser.add_argument("--list", action="store_true", help="print one shell command per run and stop")
    parser.add_argument("--output", help="the sweep's folder (default: the file's 'output')")
    add_set(
        parser,
        "override one config value in every run of the sweep (repeatable; after the file's 'set')",
    )
    parser.add_argument(
        "--on",
        choices=EXECUTORS,
        help="submit each incomplete run as a job through submitit: slurm (one array job; returns at once, "
        "see --status) or local (jobs on this machine, --jobs at a time, waited for)",
    )
    parser.add_argument(
        "--status", action="store_true", help="print each run's state (and a failed one's error)"
    )
    parser.add_argument("--wait", action="store_true", help="with --on slurm: follow the jobs until they end")
    parser.add_argument("--poll", type=float, default=30.0, help="seconds between two looks at the jobs")
    group = parser.add_argument_group("Slurm resources (override the sweep file's slurm: section)")
    for flag, (key, kind, text) in RESOURCES.items():
        group.add_argument(f"--{flag}", dest=f"slurm_{key}", type=kind, metavar=flag.upper(), help=text)
    group.add_argument(
        "--sbatch",
        dest="slurm_sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more #SBATCH option, e.g. --sbatch=--constraint=a100 (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    """`fedml-moon sweep FILE ...`: 0 when it did what was asked (and, when it waited, every run
    completed)."""
    from fedml_moon.results import submit, sweep  # the sweep's machinery when it runs, not for --help

    if args.poll <= 0 or (args.jobs is not None and args.jobs < 1):
        raise ConfigError("--poll must be > 0 seconds and --jobs >= 1")
    if args.wait and args.on != "slurm":
        raise ConfigError("--wait follows the jobs of --on slurm (--on local always waits); add --on slurm")
    if args.list:
        listed = sweep.commands(sweep.load_sweep(args.sweep_file, args.output, args.overrides))
        sys.stdout.write("".join(line + "\n" for line in listed))
        return 0
    runs = sweep.load_sweep(args.sweep_file, args.output, args.overrides, check=not args.status)
    runs = submit.absolute(runs)
    folder = runs[0].folder.parent
    if args.status:
        now = submit.states(runs, folder)
        sys.stdout.write("".join(line + "\n" for line in submit.status_lines(runs, now)))
        return 0
    if not (args.on or args.wait):
        return _here(runs, folder, args.jobs or 1)
    if args.on == "local":
        now = submit.run_local(runs, folder, _resources(args), args.jobs or 1, min(args.poll, 2.0))
    else:
        if args.on == "slurm":
            submit.submit_slurm(runs, folder, _resources(args))
            if not args.wait:
                log.info("follow it with: %s", _status_command(args))
                return 0
        now = submit.wait(runs, folder, args.poll)
    for line in submit.status_lines(runs, now):
        log.info("%s", line)
    return 0 if all(s.state == "complete" for s in now.values()) else 1


def _resources(args: argparse.Namespace) -> SlurmArgs:
    """The sweep file's `slurm:` section under the command line's values."""
    given = {key: getattr(args, f"slurm_{key}") for key, _, _ in RESOURCES.values()}
    given["sbatch"] = args.slurm_sbatch
    if args.on == "slurm" and args.jobs is not None:
        given["runs_at_a_time"] = args.jobs
    from fedml_moon.results import sweep

    return slurm_args(sweep.read_sweep_file(Path(args.sweep_file)).get("slurm"), given)


def _here(runs: list[Run], folder: Path, at_once: int) -> int:
    """The sweep on this machine, each run its own process; runs whose job a scheduler has queued
    or runs (an earlier `--on`) are left to it."""
    from fedml_moon.results import jobs, submit, sweep

    with jobs.locked(folder):
        now = submit.states(runs, folder)
        taken = [r for r in runs if now[r.name].state in ("queued", "running")]
        for run in taken:
            log.warning("run %s is %s (%s); left to it", run.name, now[run.name].state, now[run.name].detail)
        runs = [r for r in runs if r not in taken]
        outcome = sweep.run_sweep(runs, at_once)
    log.info(
        "sweep: %d runs, %d complete before, %d completed now, %d failed; outputs in %s",
        len(runs),
        len(outcome.skipped),
        len(outcome.completed),
        len(outcome.failed),
        folder,
    )
    return 1 if outcome.failed else 0


def _status_command(args: argparse.Namespace) -> str:
    """The `--status` command of this sweep, as this one was typed."""
    program = sys.argv[0] if Path(sys.argv[0]).name == "fedml-moon" else "fedml-moon"
    output = ["--output", args.output] if args.output else []
    return shlex.join([program, "sweep", args.sweep_file, *output, "--status"])
