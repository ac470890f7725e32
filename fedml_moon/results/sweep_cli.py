"""`fedml-moon sweep`'s options for a job scheduler (`--on`, `--status`, `--wait`, the Slurm
resources) and what the command does with them; the plain local sweep is `sweep.run_sweep`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fedml_moon.results import submit
from fedml_moon.results.cluster import EXECUTORS, slurm_args
from fedml_moon.results.sweep import load_sweep, read_sweep_file

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
    """The scheduler's options of `fedml-moon sweep`."""
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


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command is this module's (a scheduler, or the grid's states)."""
    return bool(args.on or args.status or args.wait)


def run(args: argparse.Namespace) -> int:
    """`fedml-moon sweep FILE --on ... | --status`: 0 when it did what was asked (and, waiting, every
    run completed)."""
    given = {key: getattr(args, f"slurm_{key}") for key, _, _ in RESOURCES.values()}
    resources = slurm_args(
        read_sweep_file(Path(args.sweep_file)).get("slurm"), {**given, "sbatch": args.slurm_sbatch}
    )
    runs = submit.absolute(load_sweep(args.sweep_file, args.output, args.overrides))
    folder = runs[0].folder.parent
    if args.status:
        now = submit.states(runs, folder)
        sys.stdout.write("".join(line + "\n" for line in submit.status_lines(runs, now)))
        return 0
    if args.on == "local":
        now = submit.run_local(runs, folder, resources, args.jobs, min(args.poll, 2.0))
    elif args.on == "slurm":
        submit.submit_slurm(runs, folder, resources)
        if not args.wait:
            log.info("follow it with: fedml-moon sweep %s --status", args.sweep_file)
            return 0
        now = submit.wait(runs, folder, args.poll)
    else:
        now = submit.wait(runs, folder, args.poll)
    for line in submit.status_lines(runs, now):
        log.info("%s", line)
    return 0 if all(s.state == "complete" for s in now.values()) else 1
