"""The command line in the test's own process."""

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def restored_main() -> Iterator[Callable[[list[str]], int]]:
    """`fedml_moon.cli.main`, with what it sets process-wide (root logger, SIGTERM handler) put back
    afterwards."""
    from fedml_moon.cli import main

    root = logging.getLogger()
    handlers, level, sigterm = root.handlers[:], root.level, signal.getsignal(signal.SIGTERM)
    try:
        yield main
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        signal.signal(signal.SIGTERM, sigterm)
