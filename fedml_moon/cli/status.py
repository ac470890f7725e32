"""`fedml-moon status TARGET`: what a run is doing (`fedml_moon.status.record`), once, or followed with
`--watch`; `--json` for scripts. TARGET is a run's output folder, or a live server's status port
(`https://HOST:PORT/`, with `--token` the operator's or a site's token file: the port's user is the
file's name, `operator` or `silo-<r>`; `--ca` the run's CA). Imports no PyTorch."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fedml_moon.errors import ConfigError, Unreachable
from fedml_moon.status.record import read, render

FINAL = ("finished", "failed", "stopped", "interrupted")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        metavar="TARGET",
        help="a run's output folder (live or finished), or a live server's status port (https://HOST:PORT/)",
    )
    parser.add_argument(
        "--token",
        metavar="FILE",
        help="for a status port: operator.token or silo-<r>.token (fedml-moon certs wrote them)",
    )
    parser.add_argument("--ca", metavar="PEM", help="for a status port over TLS: the run's CA (ca.pem)")
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
        status = _look(args)
        sys.stdout.write(json.dumps(status) + "\n" if args.json else render(status))
        sys.stdout.flush()
        if args.watch is None or status["phase"] in FINAL:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:  # stops following; the run goes on
            return 0


def _look(args: argparse.Namespace) -> dict:
    if args.run_dir.startswith(("http://", "https://")):
        return fetch(args.run_dir, args.token, args.ca)
    try:
        return read(Path(args.run_dir))
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None


def fetch(url: str, token_file: str | None, ca: str | None = None) -> dict:
    """A live server's status from its status port (`fedml_moon.status.http`)."""
    import base64
    import ssl
    import urllib.error
    import urllib.request

    if not token_file or not Path(token_file).is_file():
        raise ConfigError(
            f"--token: a status port needs the operator's or a site's token file ({token_file} is not "
            "a file), e.g. --token certs/operator.token"
        )
    user = Path(token_file).name.removesuffix(".token")
    secret = Path(token_file).read_text().strip()
    auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
    request = urllib.request.Request(url.rstrip("/") + "/status.json", headers={"Authorization": auth})
    context = ssl.create_default_context(cafile=ca) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as err:
        if err.code == 401:  # the command's own argument is wrong
            raise ConfigError(
                f"{url}: the port refused {user}'s credentials (--token {token_file})"
            ) from None
        why = "too many requests; look less often" if err.code == 429 else f"HTTP {err.code}"
        raise Unreachable(f"{url}: {why}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ssl.SSLCertVerificationError):  # the command's own --ca
            raise ConfigError(
                f"{url}: its certificate is not one the --ca ({ca or 'the system store'}) issued: {reason}; "
                "give the run's ca.pem"
            ) from None
        raise Unreachable(
            f"{url}: no status from there ({reason}); is the run's server up, with its status port on "
            "(tracking_args.status_port) at that address?"
        ) from None
