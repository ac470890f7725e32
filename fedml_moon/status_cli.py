"""`fedml-moon status RUN_DIR`: what a run is doing (`fedml_moon.status`), once, or followed with
`--watch`; `--json` for scripts. Imports no PyTorch: it reads files."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fedml_moon.errors import ConfigError
from fedml_moon.status import read, render

FINAL = ("finished", "failed", "stopped", "interrupted")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's output folder (live or finished)")
    parser.add_argument("--json", action="store_true", help="the status as one JSON object a line")
    parser.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="follow the run: the status again every SECONDS (2) until it ends; Ctrl-C stops following",
    )


def run(args: argparse.Namespace) -> int:
    """Print the run's status (again every --watch seconds until it ends)."""
    if args.watch is not None and args.watch <= 0:
        raise ConfigError("--watch takes seconds > 0 between two looks, e.g. --watch 5")
    while True:
        try:
            status = read(Path(args.run_dir))
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None
        sys.stdout.write(json.dumps(status) + "\n" if args.json else render(status))
        sys.stdout.flush()
        if args.watch is None or status["phase"] in FINAL:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:  # stops following; the run goes on
            return 0
