"""`fedml-moon check ALGORITHM --cf CONFIG`: an algorithm and its network through the conformance
suite, in every mode (`fedml_moon.conformance`)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from fedml_moon.cli.common import add_plugin, add_set
from fedml_moon.errors import ConfigError
from fedml_moon.modes import MODES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", help="a registered algorithm name (train_args.algorithm)")
    parser.add_argument("--cf", required=True, help="a config to start from (its algorithm is replaced)")
    add_set(parser, "override a config key in every run of the check (repeatable)")
    parser.add_argument(
        "--modes",
        help=f"comma-separated subset of the modes, standalone included (default: all: {', '.join(MODES)})",
    )
    parser.add_argument(
        "--model",
        metavar="NETWORK",
        help="the network to check with it (model_args.model): torchvision:NAME, timm:NAME or a plugin's "
        "module:function",
    )
    parser.add_argument("--keep", help="keep the runs in this folder (default: a temporary one, removed)")
    add_plugin(parser)


def run(args: argparse.Namespace) -> int:
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
    from fedml_moon.config.load import load_config

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
