"""`fedml-moon certs FOLDER --silos N`: a test CA, the server's and each silo's certificate and token."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from fedml_moon.errors import ConfigError

log = logging.getLogger("fedml_moon")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="where the files go (keys and tokens readable by their owner only)")
    parser.add_argument("--silos", type=int, required=True, help="how many silos (ranks 1..N)")
    parser.add_argument(
        "--host", action="append", default=[], help="an address or name of the server (repeatable)"
    )
    parser.add_argument("--days", type=int, default=825, help="validity")
    parser.add_argument(
        "--max-samples",
        action="append",
        default=[],
        metavar="RANK=N",
        help="the most samples silo RANK's party may claim, signed into its certificate (repeatable)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the credentials the folder holds (without it such a folder is refused, naming them)",
    )


def run(args: argparse.Namespace) -> int:
    from fedml_moon.security import make_certs

    hosts = args.host or ["127.0.0.1", "localhost"]
    try:
        caps = {int(r): int(n) for r, n in (item.split("=", 1) for item in args.max_samples)}
        written = make_certs(Path(args.folder), args.silos, hosts, args.days, caps, force=args.force)
    except FileExistsError as err:
        raise ConfigError(f"fedml-moon certs: {err}") from None
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
