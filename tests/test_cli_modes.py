"""The command line refuses a mode it cannot run, with one line that says what to do (exit code 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "fedml_moon", *args, "--output-dir", str(tmp_path / "out")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (("simulate", "--cf", "config/modes/moon_cross_silo_grpc.yaml"), "started with `fedml-moon run`"),
        (("run", "--cf", "config/fashion_mnist/moon.yaml"), "started with `fedml-moon simulate`"),
        (("run", "--cf", "config/modes/moon_cross_silo_grpc.yaml"), "give --rank (0 = server)"),
        (
            ("run", "--cf", "config/modes/moon_cross_silo_grpc.yaml", "--rank", "3", "--role", "server"),
            "--role server disagrees with rank 3",
        ),
        (
            ("simulate", "--cf", "config/modes/moon_mpi_simulation.yaml"),
            "runs under mpirun with 2 or more ranks",
        ),
    ],
)
def test_mode_mistakes_are_named(tmp_path, args, message):
    proc = _cli(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
