"""`fedml-moon report FOLDER ...`: tables, curves and a summary from run folders (`results/report.py`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folders", nargs="+", help="run folders, or folders holding them (a sweep's)")
    parser.add_argument("--out", help="where the report goes (default: <first folder>/report)")
    parser.add_argument(
        "--target", type=float, help="target test accuracy in [0, 1] (default: FedAvg's final)"
    )
    parser.add_argument("--latex", action="store_true", help="also write the tables as LaTeX")


def run(args: argparse.Namespace) -> int:
    from fedml_moon.results.report import write_report

    write_report([Path(f) for f in args.folders], args.out and Path(args.out), args.target, args.latex)
    return 0
