"""A run's process killed as a crash kills it, once it has checkpointed, and the resumed run compared
with the run never interrupted: the same final model and records."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import torch

from fedml_moon import conformance
from fedml_moon.core import checkpoint


def comparable_records(out: Path) -> list[dict]:
    """metrics.jsonl without timings and the transport's own byte counts (a restarted process says
    hello again, so its wire bytes differ; the payload bytes do not)."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(x).items() if not k.endswith("_time_s") and not k.startswith("wire_")}
        for x in lines
    ]


def kill_when(proc: subprocess.Popen, out: Path, rounds_done: int, extra_s: float) -> None:
    """SIGKILL once `rounds_done` rounds are recorded and the first checkpoint is written (a run
    killed before any checkpoint has nothing to resume: --resume refuses it), `extra_s` later."""
    deadline = time.monotonic() + 240
    path = out / "metrics.jsonl"
    while not (
        path.exists()
        and len(path.read_text().splitlines()) >= rounds_done
        and checkpoint.latest(out / "checkpoint") is not None
    ):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    time.sleep(extra_s)
    conformance.stop(proc, first=signal.SIGKILL)


def assert_same_run(ref: Path, out: Path) -> None:
    """A resumed run ended completed on the model and records of the run never interrupted."""
    a = torch.load(ref / "final_model.pt", weights_only=True)
    b = torch.load(out / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends with another model"
    assert comparable_records(ref) == comparable_records(out)
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
