"""`fedml-moon data DIR`: what a site's data folder holds, the config lines that agree with it and the
problems found; with `--cf`, read and checked by the run's own start-up code (`data/inspect.py`,
`data/precheck.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedml_moon.cli.common import add_set
from fedml_moon.errors import ConfigError

if TYPE_CHECKING:
    from fedml_moon.config.schema import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder",
        nargs="?",
        help="the folder a run's data_args.data_cache_dir would name (with --cf: default, the config's)",
    )
    parser.add_argument("--cf", help="the run's config: check the folder with the run's start-up code")
    add_set(parser, "override one value of the --cf config (repeatable)")
    parser.add_argument(
        "--rank", type=int, help="with --cf: read as this process does (0 the server; default: every silo)"
    )
    parser.add_argument(
        "--dataset", choices=("imagefolder", "table", "hf"), help="its format (default: guessed)"
    )
    parser.add_argument(
        "--natural", action="store_true", help="one sub-folder (or party-column value) per party"
    )
    for name, default in (("label", "label"), ("party", "party"), ("image", "image")):
        parser.add_argument(
            f"--{name}-column", default=default, help=f"the {name} column of a table or HF dataset"
        )


def run(args: argparse.Namespace) -> int:
    """Print what the folder holds; exit 1 when problems were found, 2 when it cannot be read."""
    said = [f for f, v in (("--dataset", args.dataset), ("--natural", args.natural)) if v]
    said += [f"--{n}-column" for n in ("label", "party", "image") if getattr(args, f"{n}_column") != n]
    if args.cf and said:
        raise ConfigError(f"{', '.join(said)}: the --cf config says these; use --set data_args.KEY=VALUE")
    if not args.cf and (args.overrides or args.rank is not None):
        raise ConfigError("--set and --rank go with --cf CONFIG, the config to check the folder against")
    if args.cf:
        return _with_config(args)
    if args.folder is None:
        raise ConfigError("fedml-moon data: name the site's folder, or the run's config with --cf CONFIG")
    from fedml_moon.data.formats import DataFileError
    from fedml_moon.data.inspect import inspect

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


def config_for(cf: str, overrides: list[str], folder: str | None) -> Config:
    """The run's config (`--set` applied), its `data_args.data_cache_dir` the folder to check."""
    from fedml_moon.config.load import load_config

    if folder is None:
        return load_config(cf, overrides)
    # the folder named is the one to check, whatever the config's own data_cache_dir (which may not
    # exist here) says: given as the last --set, so the config is checked with it
    return load_config(cf, [*overrides, f"data_args.data_cache_dir={Path(folder).expanduser()}"])


def _with_config(args: argparse.Namespace) -> int:
    """The folder read as the run's processes read it, with their refusals."""
    from fedml_moon.data.precheck import inspect_with_config

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
