"""Command line: `fedml-moon COMMAND ...`, one module per command, dispatched from `COMMANDS`.

fedml-moon simulate --cf FILE [--set SECTION.KEY=VALUE ...] [--output-dir DIR]
    the standalone simulation (comm_args.backend: sp), or under `mpirun -np W+1` the MPI simulation
    (comm_args.backend: MPI)
fedml-moon run --cf FILE [--rank R] [--role server|client] [--set ...] [--output-dir DIR]
    one process of a cross-silo run (common_args.training_type: cross_silo): the server (rank 0) or a
    silo; over MPI the rank comes from mpirun
fedml-moon data DIR [--dataset imagefolder|table|hf] [--natural] | data [DIR] --cf FILE [--rank R]
    what a site's data folder holds, the config lines that agree with it, and the problems found;
    with --cf, also read and checked by the run's own start-up code (exit 1 on what it refuses)
fedml-moon certs | check | new | sweep | status | report | replay | tsne ...
    test certificates, the conformance suite, a new algorithm's plugin package, sweeps, a run's
    status, reports, a buffered run replayed from its records, and t-SNE pictures (`--help` of each)
fedml-moon config [SECTION[.KEY]]
    the config keys: type, default, allowed values, description

Every command takes -v (debug logging). A command's module gives `add_arguments(parser)` and
`run(args) -> exit code`; only what --help, `config` and argument errors need is imported to build
the parser (no torch, no FedML): each command imports what it uses when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from dataclasses import dataclass

from fedml_moon.cli.common import add_verbose, setup_logging
from fedml_moon.errors import BadUpload, CheckpointError, ConfigError, SchedulerError, Unreachable

log = logging.getLogger("fedml_moon")


@dataclass(frozen=True)
class Command:
    """A command: its module under `fedml_moon.cli`, its one-line help, and the names of the module's
    functions that add its arguments and run it."""

    module: str
    help: str
    add: str = "add_arguments"
    run: str = "run"


COMMANDS: dict[str, Command] = {
    "simulate": Command(
        "train",
        "a simulation: standalone, or the MPI simulation under mpirun",
        "add_simulate_arguments",
        "start",
    ),
    "run": Command("train", "one process of a cross-silo run (server or silo)", "add_run_arguments", "start"),
    "certs": Command("certs", "create a test CA, the server's and each silo's certificate and token"),
    "check": Command("check", "run an algorithm and its network through the conformance suite (every mode)"),
    "new": Command("new", "write a plugin package for a new algorithm (passes `check` as written)"),
    "config": Command("config", "the config keys: type, default, allowed values, description"),
    "data": Command("data", "what a site's data folder holds: classes, counts, sizes, statistics, problems"),
    "sweep": Command("sweep", "run a grid of simulations (algorithms x seeds x settings)"),
    "status": Command("status", "what a run is doing: round, phase, sites, test figures, the end"),
    "report": Command("report", "tables, curves and a summary from run folders"),
    "replay": Command(
        "replay", "replay a buffered run from its records in simulation; compare the final models"
    ),
    "tsne": Command("tsne", "t-SNE of test-set representations: global and a party's model, one row per run"),
}


class Terminated(BaseException):  # like KeyboardInterrupt: no handler may swallow it
    """SIGTERM (mpirun sends it to every rank when one of them dies)."""


def _module(command: Command):
    return importlib.import_module(f"fedml_moon.cli.{command.module}")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given the command line `argv`, every command's name and help but the
    arguments of its own command only, so `fedml-moon --help` imports no command's module."""
    named = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    parser = argparse.ArgumentParser(prog="fedml-moon", description="MOON and baselines on FedML.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        child = sub.add_parser(name, help=command.help)
        if argv is None or name == named:
            getattr(_module(command), command.add)(child)
        if name != "run" and name != "simulate":  # theirs comes with the run's options
            add_verbose(child)
    return parser


def _on_sigterm(signum: int, frame: object) -> None:
    # once: a second SIGTERM (Slurm signals every process of a job, mpirun every rank) must not
    # interrupt the records the first one lets the run write
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("terminated (SIGTERM)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    setup_logging(args.verbose)
    signal.signal(signal.SIGTERM, _on_sigterm)
    command = COMMANDS[args.command]
    try:
        if getattr(args, "plugins", None):
            from fedml_moon.config.load import with_plugins

            args.overrides = with_plugins(args.cf, args.overrides, args.plugins)
        return getattr(_module(command), command.run)(args)
    except ConfigError as err:
        log.error("config error: %s", err)
        return 2
    except (SchedulerError, Unreachable) as err:
        log.error("%s", err)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted; what was computed so far is in the output directory")
        return 130
    except Terminated as err:
        log.error("%s; what was computed so far is in the output directory", err)
        return 143
    except (CheckpointError, BadUpload) as err:
        log.error("%s; the rounds recorded so far and the last checkpoint are kept", err)
        return 1


def entry() -> None:
    """The `fedml-moon` command and `python -m fedml_moon`: `main()`, then the process's exit. A
    silo's process, and one that was part of a silo's group, ends at once (`silo.group.exit_if_left`):
    native threads (gloo's; another library's under Python 3.12 in an MQTT + S3 silo) can abort an
    interpreter's ordinary exit after its run completed."""
    code = main()
    group = sys.modules.get("fedml_moon.distributed.silo.group")  # loaded only where a silo ran as a group
    if group is not None:
        group.exit_if_left(code)
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main())
