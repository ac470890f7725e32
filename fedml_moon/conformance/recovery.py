"""Crash drills for a cross-silo run on this machine (127.0.0.1), as an operator would live them.

`server_restart`: three silos and a server; the server is killed with SIGKILL while round 3 trains
(optionally one silo with it) and started again with `--resume`; the silos that were not killed are
left alone. Only the server is given the run's settings (`run`); silos are started with their own
local settings and take the rest from the server. Used by tests/test_own_data.py,
tests/test_buffered_modes.py and benchmarks/recovery.py; every process is stopped again and every
wait is bounded.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedml_moon.conformance.processes import cli_command, process_env, spawn, stop, wait_all
from fedml_moon.core.checkpoint import latest
from fedml_moon.run_folder import RunFolder, read_records


@dataclass
class Drill:
    out_dir: Path
    returncodes: list[int]
    recovery_s: float  # from the restart of the server to the first round past those recorded before the kill
    rejoin_s: float = 0.0  # from the restart of the server to every silo welcomed by it
    logs: dict[str, str] = field(default_factory=dict)


def recorded(out: Path) -> int:
    """The rounds the run in `out` has recorded so far."""
    return len(read_records(out))


def wait_rounds(out: Path, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while recorded(out) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} rounds recorded in {out} after {timeout_s:.0f} s")
        time.sleep(0.1)


def wait_checkpoint(out: Path, round_idx: int, timeout_s: float) -> None:
    """Until the run in `out` has a complete checkpoint of `round_idx` or later (a round's metrics
    row is written before its checkpoint: a server killed between the two resumes from the one before)."""
    deadline = time.monotonic() + timeout_s
    while (done := latest(RunFolder(out).checkpoints)) is None or done < round_idx:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no checkpoint of round {round_idx} in {out} after {timeout_s:.0f} s")
        time.sleep(0.1)


def wait_for(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in {log} after {timeout_s:.0f} s")
        time.sleep(0.1)


def server_restart(
    folder: Path,
    config: Path,
    run: list[str],
    local: list[str],
    kill_silo: int | None = None,
    after_rounds: int = 3,
    down_s: float = 4.0,
    timeout_s: float = 240.0,
    own: dict[int, list[str]] | None = None,
) -> Drill:
    """The drill above in `folder`; `kill_silo`: a silo rank killed together with the server and
    started again (it then loads its own checkpoint); `down_s`: how long the server stays dead;
    `own`: each silo's own settings besides `local` (its data folder, its certificate)."""
    out, env = folder / "run", process_env(folder)
    server = [*cli_command("run", config, [*run, *local], out), "--rank", "0"]

    def silo(r: int) -> list[str]:
        return [*cli_command("run", config, [*local, *(own or {}).get(r, [])], out), "--rank", str(r)]

    silos = {r: spawn(silo(r), folder / f"silo-{r}.log", env, folder) for r in (1, 2, 3)}
    first = spawn(server, folder / "server-1.log", env, folder)
    started = [first, *silos.values()]
    try:
        wait_rounds(out, after_rounds, timeout_s)
        time.sleep(0.1)  # into the next round
        stop(first, first=signal.SIGKILL)
        if RunFolder(out).summary.exists():
            raise RuntimeError("the run ended before its server was killed: give it more rounds")
        if kill_silo is not None:
            stop(silos[kill_silo], first=signal.SIGKILL)
        before = recorded(out)
        time.sleep(down_s)
        if kill_silo is not None:
            log = folder / f"silo-{kill_silo}-again.log"
            silos[kill_silo] = spawn(silo(kill_silo), log, env, folder)
            started.append(silos[kill_silo])
        restarted = time.monotonic()
        again = spawn([*server, "--resume", str(out)], folder / "server-2.log", env, folder)
        started.append(again)
        wait_for(folder / "server-2.log", "is ready (3 of 3)", timeout_s)
        rejoin = time.monotonic() - restarted
        wait_rounds(out, before + 1, timeout_s)  # back to where it died, and one round further
        recovery = time.monotonic() - restarted
        codes = wait_all([again, *silos.values()], timeout_s)
    finally:
        for proc in started:
            stop(proc)
    logs = {p.name: p.read_text(errors="replace") for p in folder.glob("*.log")}
    return Drill(out, codes, recovery, rejoin, logs)


def silo_loss(
    folder: Path, config: Path, run: list[str], timeout_s: float = 240.0
) -> tuple[list[int], float]:
    """Three silos (all settings given to every process); silo 2 is killed with SIGKILL after round 1.
    Returns the exit codes and the seconds until the server's round went on without it."""
    out, env = folder / "run", process_env(folder)
    cmd = cli_command("run", config, run, out)
    server = spawn([*cmd, "--rank", "0"], folder / "server.log", env, folder)
    silos = [spawn([*cmd, "--rank", str(r)], folder / f"silo-{r}.log", env, folder) for r in (1, 2, 3)]
    try:
        wait_rounds(out, 2, timeout_s)
        stop(silos[1], first=signal.SIGKILL)
        killed = time.monotonic()
        wait_for(folder / "server.log", "goes on without parties [1]", timeout_s)
        noticed = time.monotonic() - killed
        codes = wait_all([server, silos[0], silos[2]], timeout_s)
    finally:
        for proc in [server, *silos]:
            stop(proc)
    return codes, noticed
