"""`fedml-moon tsne RUN_DIR ...`: t-SNE pictures of test-set representations (`results/tsne.py`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger("fedml_moon")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (final_model.pt; party_models/ for --party); several: one row each",
    )
    parser.add_argument("--party", type=int, help="also a party's local model (train_args.save_party_models)")
    parser.add_argument("--samples", type=int, default=2000, help="test images embedded")
    parser.add_argument("--out", help="the PNG (default: the first RUN_DIR's tsne.png)")


def run(args: argparse.Namespace) -> int:
    from fedml_moon.results.tsne import tsne

    runs = [Path(d) for d in args.run_dirs]
    path = tsne(runs, args.party, args.samples, args.out and Path(args.out))
    log.info("t-SNE picture: %s", path)
    return 0
