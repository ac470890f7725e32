"""A checkpoint written before goes on: `tests/data/run-before-numpy2` is the folder of a MOON run that
fedml_moon wrote on Python 3.11 with NumPy 1.26 and FedML's 2022 pins (FedML's whole package imported,
`fedml.init` called), stopped with SIGTERM after round 1's checkpoint (its summary says "failed"; the
plots and the model file it wrote are left out). `--resume` with this fedml_moon (NumPy 2, FedML's
parts only) ends on the model of the same run never interrupted, bit for bit: both run here, on one
PyTorch build, as the recorded runs (`tests/support/recorded_runs.py`) do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
    assert resumed["final_model_sha256"] == whole["final_model_sha256"]
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 1, 2, 3]  # every round recorded once
