"""`fedml-moon` processes forked from a process that has already imported what each of them imports.

A `python -m fedml_moon` process spends about 2 s of a core importing PyTorch and FedML's parts
before its first line of work, and a run in every mode starts a dozen of them. `start` forks the
command instead from a server process that imported those modules once (multiprocessing's
forkserver, PRELOAD): the child is a process of its own, with its own pid and session, working
directory, environment, `sys.path` and log file, and runs the package's `__main__` as `python -m
fedml_moon` does (`runpy.run_module`), or a script as `python SCRIPT` does; it reaches the other
processes of its run over the same real transports. What children share is what a fresh start would
not: the modules' memory (copy-on-write), the interpreter's hash seed, and environment variables
already read when the server imported its modules (it imports no transport: gRPC, protobuf, paho-
mqtt and mpi4py load in each child, under the child's environment; matplotlib's settings and font
cache are the server's).

Used where a run's start-up is not what is tested: `fedml-moon check` and the suite start their
standalone, gRPC and MQTT + S3 processes through `processes.spawn`, which forks a command of the
form `python -m fedml_moon ...` or `python SCRIPT.py ...` from here. The MPI modes start under
`mpirun`, and the commands the docs show run as typed. `FEDML_MOON_PRELOAD=0` in the environment of
the process that starts them makes every one a fresh interpreter again. As with any use of
multiprocessing's forkserver, a script that starts runs this way keeps its work under
`if __name__ == "__main__":` (the `fedml-moon` command, `python -m fedml_moon` and pytest do).
"""

from __future__ import annotations

import atexit
import functools
import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PRELOAD = [
    "torch",
    "torch._dynamo",  # torchvision imports it (its ops): where a run reads an image folder, 1.2 s
    "fedml_moon.cli",
    "fedml_moon.config.load",
    "fedml_moon.adapters.trainer",
    "fedml_moon.adapters.aggregator",
    "fedml_moon.distributed.managers",
    "fedml_moon.data.federated",
    "matplotlib.backends.backend_agg",  # what a process imports to draw its partition and accuracy: 0.3 s
    "matplotlib.figure",
]
"""What the server process imports once, for every child: what each server or silo imports first."""

NEVER_PRELOADED = ("grpc", "google.protobuf", "paho", "mpi4py", "wandb", "torchvision")
"""Modules that load in each child, never in the server: their state, or the environment they read at
import, is the child's (tests/test_preloaded.py)."""


def enabled(env: dict[str, str] | None = None) -> bool:
    """Whether commands are forked from the preloaded server (FEDML_MOON_PRELOAD, on unless "0")."""
    return (os.environ if env is None else env).get("FEDML_MOON_PRELOAD", "1") != "0"


def forkable(cmd: list[str]) -> bool:
    """`python -m fedml_moon ...` or `python SCRIPT.py ...`, with this interpreter."""
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return False
    return cmd[1:3] == ["-m", "fedml_moon"] or (cmd[1].endswith(".py") and not cmd[1].startswith("-"))


@functools.lru_cache(maxsize=1)
def _base_path() -> tuple[str, ...]:
    """`sys.path` of a fresh interpreter of this Python, without its first entry (the script's or the
    working directory) and without PYTHONPATH: what each child's path is built on."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import json, sys; print(json.dumps(sys.path[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, check=True
    )
    return tuple(json.loads(done.stdout))


@functools.lru_cache(maxsize=1)
def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class Forked:
    """A child of the preloaded server, with `subprocess.Popen`'s `pid`, `args`, `returncode`, `poll`,
    `wait` (a negative code: the signal that ended it), `send_signal`, `terminate` and `kill`."""

    def __init__(self, process: Any, args: list[str]) -> None:
        self._process, self.args, self.pid = process, args, process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode  # type: ignore[return-value]


def start(cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> Forked:
    """Fork `cmd` (see `forkable`) from the preloaded server: its stdout and stderr to `log_path`, in a
    session of its own, in `cwd`, with `env` as its whole environment."""
    sys.audit("fedml_moon.fork", cmd)  # what a started process raises (subprocess.Popen), for watchers
    base = _base_path()
    Path(log_path).write_bytes(b"")  # there when this returns, as a Popen's log is
    process = _context().Process(
        target=_child, args=(cmd[1:], str(log_path), dict(env), str(cwd), base), name=f"fedml-moon {cmd[1]}"
    )
    process.start()
    # Like a subprocess.Popen, never joined at this process's exit: whoever started it stops it.
    multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
    return Forked(process, cmd)


def _child(words: list[str], log_path: str, env: dict[str, str], cwd: str, base: tuple[str, ...]) -> None:
    """In the forked child: become the process `python WORDS...` would be, then run it."""
    os.setsid()
    out = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = cwd if words[0] == "-m" else str(Path(words[0]).resolve().parent)
    sys.path[:] = [first, *extra, *base]
    sys.argv = list(["-m", *words[2:]] if words[0] == "-m" else words)  # run_module sets argv[0]
    try:
        if words[0] == "-m":  # `python -m fedml_moon`: its __main__.py, argv[0] its path
            runpy.run_module(words[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(words[0], run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # as the interpreter does at exit (multiprocessing's children skip it)
