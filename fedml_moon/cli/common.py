"""What several commands share: the run's options (`--cf`, `--set`, ...), `--plugin`, `-v`, and how the
log lines look."""

from __future__ import annotations

import argparse
import logging


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that runs a config (`simulate`, `run`)."""
    parser.add_argument("--cf", required=True, help="config file in FedML's fedml_config.yaml layout")
    add_set(parser, "override one config value (repeatable), e.g. --set train_args.comm_round=5")
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
    add_plugin(parser)


def add_set(parser: argparse.ArgumentParser, text: str) -> None:
    """`--set SECTION.KEY=VALUE` (repeatable), into `args.overrides`."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=text
    )


def add_plugin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE:ATTRIBUTE",
        help="load an algorithm from a module on the Python path or in this directory, without installing "
        "it (repeatable; adds to common_args.plugins), e.g. --plugin fedml_moon_fedproto:spec",
    )


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def setup_logging(verbose: bool, rank: int | None = None, process: int | None = None) -> None:
    """Log lines name the rank, and the process within a hierarchical silo's group."""
    who = f" rank {rank}" if rank is not None else ""
    who += f" process {process}" if process is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s{who} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
