"""`fedml-moon` processes forked from a process that has already imported what each of them imports.

A `python -m fedml_moon` process spends about 2 s of a core importing PyTorch and FedML's parts
before its first line of work, and a run in every mode starts a dozen of them. `start` forks the
command instead from a server process that imported those modules once (multiprocessing's
forkserver, PRELOAD): the child is a process of its own, with its own pid and session, working
directory, environment, `sys.path` and log file, and runs `fedml_moon.cli.main` (or a script, as
`python SCRIPT` would) exactly as `python -m fedml_moon` does; it reaches the other processes of its
run over the same real transports. What children share is what a fresh start would not: the
modules' memory (copy-on-write), the interpreter's hash seed, and environment variables already read
when the server imported its modules (it imports no transport: gRPC, protobuf, paho-mqtt and mpi4py
load in each child, under the child's environment).

Used where a run's start-up is not what is tested: `fedml-moon check` and the suite start their
standalone, gRPC and MQTT + S3 processes through `processes.spawn`, which forks a command of the
form `python -m fedml_moon ...` or `python SCRIPT.py ...` from here. The MPI modes start under
`mpirun`, and the commands the docs show run as typed. `FEDML_MOON_PRELOAD=0` in the environment of
the process that starts them makes every one a fresh interpreter again.
"""

from __future__ import annotations

import atexit
import functools
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

PRELOAD = [
    "torch",
    "fedml_moon.cli",
    "fedml_moon.config",
    "fedml_moon.adapters.trainer",
    "fedml_moon.adapters.aggregator",
    "fedml_moon.distributed.managers",
    "fedml_moon.data.federated",
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
    """A child of the preloaded server, with what `processes` uses of `subprocess.Popen`: `pid`,
    `args`, `returncode`, `poll`, `wait` (a negative code: the signal that ended it)."""

    def __init__(self, process: Any, args: list[str]) -> None:
        self._process, self.args, self.pid = process, args, process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode  # type: ignore[return-value]


def start(cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> Forked:
    """Fork `cmd` (see `forkable`) from the preloaded server: its stdout and stderr to `log_path`, in a
    session of its own, in `cwd`, with `env` as its whole environment."""
    base = _base_path()
    process = _context().Process(
        target=_child, args=(cmd[1:], str(log_path), dict(env), str(cwd), base), name=f"fedml-moon {cmd[1]}"
    )
    process.start()
    return Forked(process, cmd)


def _child(words: list[str], log_path: str, env: dict[str, str], cwd: str, base: tuple[str, ...]) -> None:
    """In the forked child: become the process `python WORDS...` would be, then run it."""
    os.setsid()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
    if words[0] == "-m":
        sys.argv = [str(Path(__import__("fedml_moon").__file__).with_name("__main__.py")), *words[2:]]
        sys.path[:] = [cwd, *extra, *base]
    else:
        sys.argv = list(words)
        sys.path[:] = [str(Path(words[0]).resolve().parent), *extra, *base]
    try:
        if words[0] == "-m":
            from fedml_moon.cli import main

            code = main(words[2:])
        else:
            runpy.run_path(words[0], run_name="__main__")
            code = 0
    finally:
        atexit._run_exitfuncs()  # as the interpreter does at exit (multiprocessing's children skip it)
    sys.exit(code)
