"""Command line: `fedml-moon simulate --cf FILE [--set SECTION.KEY=VALUE ...] [--output-dir DIR]`."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from fedml_moon.config import ConfigError, load_config

log = logging.getLogger("fedml_moon")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedml-moon", description="MOON and baselines on FedML.")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run a standalone (single-process) simulation")
    sim.add_argument("--cf", required=True, help="config file in FedML's fedml_config.yaml layout")
    sim.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set train_args.comm_round=5",
    )
    sim.add_argument("--output-dir", help="where metrics, summary and plots go (default: outputs/<run>)")
    sim.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def default_output_dir(algorithm: str, dataset: str) -> Path:
    return Path("outputs") / f"{algorithm}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        cfg = load_config(args.cf, args.overrides)
        out_dir = (
            Path(args.output_dir)
            if args.output_dir
            else default_output_dir(cfg.train_args.algorithm, cfg.data_args.dataset)
        )
        from fedml_moon.glue.run import simulate

        summary = simulate(cfg, out_dir)
    except ConfigError as err:
        log.error("config error: %s", err)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted; what was computed so far is in the output directory")
        return 130
    acc = summary.get("final_test_acc")
    log.info(
        "done: final_test_acc %s, best_test_acc %s (round %s), %.1f s; results in %s",
        f"{acc:.4f}" if acc is not None else "n/a",
        f"{summary['best_test_acc']:.4f}" if summary.get("best_test_acc") is not None else "n/a",
        summary.get("best_round"),
        summary.get("total_time_s", 0.0),
        out_dir,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
