"""`fedml-moon new NAME`: a plugin package for a new algorithm that passes `check` as written."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger("fedml_moon")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the algorithm's name, a lowercase identifier (train_args.algorithm)")
    parser.add_argument("--dir", help="where the package goes (default: ./NAME); must be empty or new")


def run(args: argparse.Namespace) -> int:
    from fedml_moon.kit import write_plugin

    folder = Path(args.dir or args.name)
    written = write_plugin(args.name, folder)
    log.info("wrote %s", ", ".join(str(p) for p in written))
    log.info("next: fedml-moon check %s --cf %s", args.name, folder / f"{args.name}.yaml")
    return 0
