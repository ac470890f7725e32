"""`fedml-moon config [SECTION[.KEY]]`: the config keys, with their type, default, allowed values and
description, read from the code (`config/reference.py`)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "selector",
        nargs="?",
        metavar="SECTION[.KEY]",
        help="a section (train_args) or one key (train_args.algorithm); none: every section",
    )


def run(args: argparse.Namespace) -> int:
    from fedml_moon.config.reference import text

    sys.stdout.write(text(args.selector))
    return 0
