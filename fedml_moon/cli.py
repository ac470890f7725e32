"""Command line.

fedml-moon simulate --cf FILE [--set SECTION.KEY=VALUE ...] [--output-dir DIR]
    the standalone simulation (comm_args.backend: sp), or under `mpirun -np W+1` the MPI simulation
    (comm_args.backend: MPI)
fedml-moon run --cf FILE [--rank R] [--role server|client] [--set ...] [--output-dir DIR]
    one process of a cross-silo run (common_args.training_type: cross_silo): the server (rank 0) or a
    silo; over MPI the rank comes from mpirun
fedml-moon data DIR [--dataset imagefolder|table|hf] [--natural] | data [DIR] --cf FILE [--rank R]
    what a site's data folder holds, the config lines that agree with it, and the problems found;
    with --cf, also read and checked by the run's own start-up code (exit 1 on what it refuses)
fedml-moon certs | check | new | sweep | report | replay | tsne ...
    test certificates, the conformance suite, a new algorithm's plugin package, sweeps, reports, a
    buffered run replayed from its records, and t-SNE pictures (`--help` of each)
fedml-moon config [SECTION[.KEY]]
    the config keys: type, default, allowed values, description

Every subcommand takes -v (debug logging).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedml_moon.errors import BadUpload, CheckpointError, ConfigError, SchedulerError
from fedml_moon.modes import MODES
from fedml_moon.records import claim_folder, running

if TYPE_CHECKING:
    from fedml_moon.config import Config

# Only what --help, `config` and argument errors need is imported here (no torch, no FedML); each
# command imports what it uses when it runs.

log = logging.getLogger("fedml_moon")


class Terminated(BaseException):  # like KeyboardInterrupt: no handler may swallow it
    """SIGTERM (mpirun sends it to every rank when one of them dies)."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cf", required=True, help="config file in FedML's fedml_config.yaml layout")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set train_args.comm_round=5",
    )
    parser.add_argument("--output-dir", help="where metrics, summary and plots go (default: outputs/<run>)")
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help="go on from the newest checkpoint of the run in DIR (its output directory)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start anew in an output directory that holds an earlier run's records, replacing them once "
        "the run starts (without it such a directory is refused; the server's, in a distributed run)",
    )
    _plugin(parser)
    _verbose(parser)


def _plugin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE:ATTRIBUTE",
        help="load an algorithm from a module on the Python path or in this directory, without installing "
        "it (repeatable; adds to common_args.plugins), e.g. --plugin fedml_moon_fedproto:spec",
    )


def _verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedml-moon", description="MOON and baselines on FedML.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _common(sub.add_parser("simulate", help="a simulation: standalone, or the MPI simulation under mpirun"))
    run = sub.add_parser("run", help="one process of a cross-silo run (server or silo)")
    _common(run)
    run.add_argument("--rank", type=int, help="0 for the server, 1..N for the silos (MPI: from mpirun)")
    run.add_argument("--role", choices=("server", "client"), help="must agree with --rank (FedML's style)")
    certs = sub.add_parser(
        "certs", help="create a test CA, the server's and each silo's certificate and token"
    )
    certs.add_argument("folder", help="where the files go (keys and tokens readable by their owner only)")
    certs.add_argument("--silos", type=int, required=True, help="how many silos (ranks 1..N)")
    certs.add_argument(
        "--host", action="append", default=[], help="an address or name of the server (repeatable)"
    )
    certs.add_argument("--days", type=int, default=825, help="validity")
    certs.add_argument(
        "--max-samples",
        action="append",
        default=[],
        metavar="RANK=N",
        help="the most samples silo RANK's party may claim, signed into its certificate (repeatable)",
    )
    _verbose(certs)
    check = sub.add_parser(
        "check", help="run an algorithm and its network through the conformance suite (every mode)"
    )
    check.add_argument("algorithm", help="a registered algorithm name (train_args.algorithm)")
    check.add_argument("--cf", required=True, help="a config to start from (its algorithm is replaced)")
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key in every run of the check (repeatable)",
    )
    check.add_argument(
        "--modes",
        help=f"comma-separated subset of the modes, standalone included (default: all: {', '.join(MODES)})",
    )
    check.add_argument(
        "--model",
        metavar="NETWORK",
        help="the network to check with it (model_args.model): torchvision:NAME, timm:NAME or a plugin's "
        "module:function",
    )
    check.add_argument("--keep", help="keep the runs in this folder (default: a temporary one, removed)")
    _plugin(check)
    _verbose(check)
    new = sub.add_parser("new", help="write a plugin package for a new algorithm (passes `check` as written)")
    new.add_argument("name", help="the algorithm's name, a lowercase identifier (train_args.algorithm)")
    new.add_argument("--dir", help="where the package goes (default: ./NAME); must be empty or new")
    _verbose(new)
    config = sub.add_parser("config", help="the config keys: type, default, allowed values, description")
    config.add_argument(
        "selector",
        nargs="?",
        metavar="SECTION[.KEY]",
        help="a section (train_args) or one key (train_args.algorithm); none: every section",
    )
    _verbose(config)
    data = sub.add_parser(
        "data", help="what a site's data folder holds: classes, counts, sizes, statistics, problems"
    )
    data.add_argument(
        "folder", nargs="?", help="the folder a run's data_args.data_cache_dir would name (with --cf: "
        "default, the config's)",
    )  # fmt: skip
    data.add_argument("--cf", help="the run's config: check the folder with the run's start-up code")
    data.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="override one value of the --cf config (repeatable)")  # fmt: skip
    data.add_argument(
        "--rank", type=int, help="with --cf: read as this process does (0 the server; default: every silo)"
    )
    data.add_argument(
        "--dataset", choices=("imagefolder", "table", "hf"), help="its format (default: guessed)"
    )
    data.add_argument(
        "--natural", action="store_true", help="one sub-folder (or party-column value) per party"
    )
    for name, default in (("label", "label"), ("party", "party"), ("image", "image")):
        data.add_argument(
            f"--{name}-column", default=default, help=f"the {name} column of a table or HF dataset"
        )
    _verbose(data)
    sweep = sub.add_parser("sweep", help="run a grid of simulations (algorithms x seeds x settings)")
    sweep.add_argument("sweep_file", help="a sweep file: base config, grid, output folder")
    sweep.add_argument(
        "--jobs",
        type=int,
        help="runs at a time (default 1; threads per run: cores / jobs); with --on slurm: the array's %%N",
    )
    sweep.add_argument("--list", action="store_true", help="print one shell command per run and stop")
    sweep.add_argument("--output", help="the sweep's folder (default: the file's 'output')")
    sweep.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value in every run of the sweep (repeatable; after the file's 'set')",
    )
    from fedml_moon.results import sweep_cli

    sweep_cli.add_arguments(sweep)
    _verbose(sweep)
    status = sub.add_parser("status", help="what a run is doing: round, phase, sites, test figures, the end")
    from fedml_moon import status_cli

    status_cli.add_arguments(status)
    _verbose(status)
    report = sub.add_parser("report", help="tables, curves and a summary from run folders")
    report.add_argument("folders", nargs="+", help="run folders, or folders holding them (a sweep's)")
    report.add_argument("--out", help="where the report goes (default: <first folder>/report)")
    report.add_argument(
        "--target", type=float, help="target test accuracy in [0, 1] (default: FedAvg's final)"
    )
    report.add_argument("--latex", action="store_true", help="also write the tables as LaTeX")
    _verbose(report)
    replay = sub.add_parser(
        "replay", help="replay a buffered run from its records in simulation; compare the final models"
    )
    from fedml_moon import replay_cli

    replay_cli.add_arguments(replay)
    _verbose(replay)
    tsne = sub.add_parser(
        "tsne", help="t-SNE of test-set representations: global and a party's model, one row per run"
    )
    tsne.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (final_model.pt; party_models/ for --party); several: one row each",
    )
    tsne.add_argument("--party", type=int, help="also a party's local model (train_args.save_party_models)")
    tsne.add_argument("--samples", type=int, default=2000, help="test images embedded")
    tsne.add_argument("--out", help="the PNG (default: the first RUN_DIR's tsne.png)")
    _verbose(tsne)
    return parser


def _certs(args: argparse.Namespace) -> int:
    from fedml_moon.security import make_certs

    hosts = args.host or ["127.0.0.1", "localhost"]
    try:
        caps = {int(r): int(n) for r, n in (item.split("=", 1) for item in args.max_samples)}
        written = make_certs(Path(args.folder), args.silos, hosts, args.days, caps)
    except ValueError as err:
        raise ConfigError(f"fedml-moon certs: {err} (--max-samples takes RANK=N, e.g. 2=50000)") from None
    log.info(
        "wrote %d files to %s (server certificate valid for %s; its .gitignore keeps git from adding the "
        "keys and tokens)",
        len(written),
        args.folder,
        ", ".join(hosts),
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from fedml_moon import conformance

    modes = tuple(args.modes.split(",")) if args.modes else conformance.MODES
    unknown = sorted(set(modes) - set(conformance.MODES))
    if unknown or "standalone" not in modes:
        raise ConfigError(
            f"--modes: {unknown or 'standalone is required'}; choose from {', '.join(conformance.MODES)}"
        )
    overrides = [*args.overrides, f"train_args.algorithm={args.algorithm}"]
    if args.model:
        overrides.append(f"model_args.model={args.model}")
    from fedml_moon.config import load_config

    load_config(args.cf, overrides)  # a config mistake stops here, with the key named
    # the check's processes run elsewhere: paths are resolved here, once, against this directory
    config = Path(args.cf).resolve()
    folder = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="fedml-moon-check-"))
    try:
        checks = conformance.check_algorithm(config, overrides, folder, modes)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    for c in checks:
        said = ("" if c.ok else f": {c.detail}") + (f" ({c.note})" if c.note else "")
        sys.stdout.write(f"{'PASS' if c.ok else 'FAIL'}  {c.name}{said}\n")
    failed = sum(not c.ok for c in checks)
    sys.stdout.write(f"{args.algorithm}: {len(checks) - failed} of {len(checks)} checks passed\n")
    return 0 if not failed else 1


def _new(args: argparse.Namespace) -> int:
    from fedml_moon.kit import write_plugin

    folder = Path(args.dir or args.name)
    written = write_plugin(args.name, folder)
    log.info("wrote %s", ", ".join(str(p) for p in written))
    log.info("next: fedml-moon check %s --cf %s", args.name, folder / f"{args.name}.yaml")
    return 0


def _data(args: argparse.Namespace) -> int:
    """Print what the folder holds; exit 1 when problems were found, 2 when it cannot be read."""
    from fedml_moon.data.formats import DataFileError
    from fedml_moon.data.inspect import inspect

    said = [f for f, v in (("--dataset", args.dataset), ("--natural", args.natural)) if v]
    said += [f"--{n}-column" for n in ("label", "party", "image") if getattr(args, f"{n}_column") != n]
    if args.cf and said:
        raise ConfigError(f"{', '.join(said)}: the --cf config says these; use --set data_args.KEY=VALUE")
    if not args.cf and (args.overrides or args.rank is not None):
        raise ConfigError("--set and --rank go with --cf CONFIG, the config to check the folder against")
    if args.cf:
        from fedml_moon.data.precheck import config_for, inspect_with_config

        if args.rank is not None and args.rank < 0:
            raise ConfigError(f"--rank {args.rank}: give 0 (the server) or a silo's rank, 1 or more")
        if args.folder is not None and not Path(args.folder).expanduser().is_dir():
            raise ConfigError(f"{args.folder}: no such folder; name the folder holding the site's data")
        cfg = config_for(args.cf, args.overrides, args.folder)
        where = cfg.data_args.data_cache_dir
        if where and not Path(where).is_dir():
            raise ConfigError(f"{where}: no such folder; name the folder holding the site's data")
        text, problems = inspect_with_config(cfg, args.cf, args.rank)
        sys.stdout.write(text)
        return 1 if problems else 0
    if args.folder is None:
        raise ConfigError("fedml-moon data: name the site's folder, or the run's config with --cf CONFIG")
    folder = Path(args.folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{args.folder}: no such folder; name the folder holding the site's data")
    try:
        text, problems = inspect(
            folder, args.dataset, args.natural, args.label_column, args.party_column, args.image_column
        )
    except DataFileError as err:
        raise ConfigError(str(err)) from None
    sys.stdout.write(text)
    return 1 if problems else 0


def default_output_dir(cfg: Config) -> Path:
    name = f"{cfg.train_args.algorithm}-{cfg.data_args.dataset}"
    if cfg.comm_args.backend == "sp":
        return Path("outputs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path("outputs") / f"{name}-{cfg.comm_args.run_id}"  # the same folder for every process


def _setup_logging(verbose: bool, rank: int | None = None, process: int | None = None) -> None:
    """Log lines name the rank, and the process within a hierarchical silo's group."""
    who = f" rank {rank}" if rank is not None else ""
    who += f" process {process}" if process is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s{who} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )


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
            from fedml_moon.distributed.mpi_silos import split

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
    hierarchical one N x P + 1: `mpi_silos`)."""
    args = build_parser().parse_args(argv)
    if args.command != "run":
        raise ConfigError(
            f"`{args.command}` under mpirun: give the number of ranks, e.g. 3 (a server, 2 workers)"
        )
    from fedml_moon.config import load_config

    cfg = load_config(args.cf, args.overrides)
    if (cfg.common_args.training_type, cfg.comm_args.backend) != ("cross_silo", "MPI"):
        raise ConfigError(
            f"{args.cf}: training_type {cfg.common_args.training_type} / backend {cfg.comm_args.backend} "
            "does not run under mpirun; cross-silo over MPI needs cross_silo / MPI"
        )
    if cfg.common_args.scenario == "hierarchical":
        from fedml_moon.distributed.mpi_silos import group_size

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
    _setup_logging(args.verbose, rank, _group_process(cfg, rank, placed))
    explicit = explicit_keys(args.overrides, cfg)  # a silo's own --set must agree with the server's
    resume = bool(args.resume)
    if rank == 0 and not resume:  # the server writes the run's records
        claim_folder(out_dir, args.overwrite)
    status = run_process(cfg, out_dir, rank, size, comm, resume, explicit, placed, bool(args.overwrite))
    log.info("rank %d finished: %s", rank, status)
    if rank != 0:  # a silo's files are written: its exit skips the teardown that can abort it
        from fedml_moon.distributed.silo_group import end_at_exit

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


def _on_sigterm(signum: int, frame: object) -> None:
    # once: a second SIGTERM (Slurm signals every process of a job, mpirun every rank) must not
    # interrupt the records the first one lets the run write
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("terminated (SIGTERM)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if getattr(args, "plugins", None):
            from fedml_moon.config import with_plugins

            args.overrides = with_plugins(args.cf, args.overrides, args.plugins)
        if args.command == "check":
            return _check(args)
        if args.command == "certs":
            return _certs(args)
        if args.command == "new":
            return _new(args)
        if args.command == "sweep":
            from fedml_moon.results import sweep_cli

            return sweep_cli.run(args)
        if args.command == "status":
            from fedml_moon import status_cli

            return status_cli.run(args)
        if args.command == "data":
            return _data(args)
        if args.command == "config":
            from fedml_moon.config_reference import text

            sys.stdout.write(text(args.selector))
            return 0
        if args.command == "replay":
            from fedml_moon import replay_cli

            return replay_cli.run(args)
        if args.command == "tsne":
            from fedml_moon.results.tsne import tsne

            runs = [Path(d) for d in args.run_dirs]
            path = tsne(runs, args.party, args.samples, args.out and Path(args.out))
            log.info("t-SNE picture: %s", path)
            return 0
        if args.command == "report":
            from fedml_moon.results.report import write_report

            write_report(
                [Path(f) for f in args.folders], args.out and Path(args.out), args.target, args.latex
            )
            return 0
        # imported here, PyTorch with it: a command that loads no config (sweep --status, report) imports none
        from fedml_moon.config import load_config

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
    except ConfigError as err:
        log.error("config error: %s", err)
        return 2
    except SchedulerError as err:
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
    _report(summary, out_dir)
    return 0


def entry() -> None:
    """The `fedml-moon` command and `python -m fedml_moon`: `main()`, then the process's exit. A
    silo's process, and one that was part of a silo's group, ends at once (`silo_group.exit_if_left`):
    native threads (gloo's; another library's under Python 3.12 in an MQTT + S3 silo) can abort an
    interpreter's ordinary exit after its run completed."""
    code = main()
    group = sys.modules.get("fedml_moon.distributed.silo_group")  # loaded only where a silo ran as a group
    if group is not None:
        group.exit_if_left(code)
    sys.exit(code)


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


if __name__ == "__main__":
    sys.exit(main())
