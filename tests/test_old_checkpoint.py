"""A checkpoint written before goes on: `tests/data/run-before-numpy2` is the folder of a MOON run that
fedml_moon wrote on Python 3.11 with NumPy 1.26 and FedML's 2022 pins (FedML's whole package imported,
`fedml.init` called), stopped with SIGTERM after round 1's checkpoint (its summary says "failed"; the
plots and the model file it wrote are left out). `--resume` with this fedml_moon (NumPy 2, FedML's
parts only) ends on the model of the same run never interrupted, bit for bit: both run here, on one
PyTorch build, as the recorded runs (`tests/support/recorded_runs.py`) do. Bit for bit where this
machine's CPU computes the recorded rounds bit for bit (its rounds 0 and 1 are the recorded ones);
where its kernels round otherwise (another x86 vector unit: the rounds differ in the last bits), the
resumed run goes on from the recorded state and ends within the modes' tolerance (1e-5) of the run
never interrupted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.support.cli import restored_main
from tests.support.marks import needs_fmnist

ROOT = Path(__file__).resolve().parents[1]
WRITTEN_BEFORE = ROOT / "tests" / "data" / "run-before-numpy2"
SETTINGS = [
    "data_args.max_train_samples=800",
    "data_args.max_test_samples=300",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=4",
    "train_args.epochs=1",
    "train_args.batch_size=32",
    "train_args.checkpoint_every=1",
    "tracking_args.enable_wandb=false",
    "device_args.torch_threads=1",
]
"""The settings the run in WRITTEN_BEFORE was started with (with config/fashion_mnist/moon.yaml)."""
TIMINGS = ("round_time_s",)
TOLERANCE = 1e-5  # the modes' equality (tests/test_modes.py)


def _simulate(*extra: str) -> int:
    sets = [a for s in SETTINGS for a in ("--set", s)]
    with restored_main() as main:
        return main(["simulate", "--cf", str(ROOT / "config/fashion_mnist/moon.yaml"), *sets, *extra])


@needs_fmnist
def test_a_run_stopped_before_numpy_2_resumes_to_the_model_of_a_run_never_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "stopped"
    shutil.copytree(WRITTEN_BEFORE, folder)
    before = json.loads((folder / "summary.json").read_text())
    assert before["status"] == "failed" and before["rounds_completed"] == 2  # stopped after round 1
    assert _simulate("--resume", str(folder)) == 0
    assert _simulate("--output-dir", str(tmp_path / "whole")) == 0
    resumed = json.loads((folder / "summary.json").read_text())
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert resumed["status"] == whole["status"] == "completed"
    assert resumed["rounds_completed"] == whole["rounds_completed"] == 4
    records = _records(folder)
    assert [r["round"] for r in records] == [0, 1, 2, 3]  # every round recorded once
    if _records(tmp_path / "whole")[:2] == _records(WRITTEN_BEFORE):  # this CPU computes them bit for bit
        assert resumed["final_model_sha256"] == whole["final_model_sha256"]
        return
    ours = torch.load(folder / "final_model.pt", weights_only=True)
    theirs = torch.load(tmp_path / "whole" / "final_model.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    far = {k: float((ours[k].double() - theirs[k].double()).abs().max()) for k in ours}
    assert max(far.values()) <= TOLERANCE, sorted(far.items(), key=lambda kv: -kv[1])[:3]


def _records(folder: Path) -> list[dict]:
    """A run's records, their timings left out."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]
