"""What a run leaves, by how it ended: final_model.pt only when it completed, else
model_at_<status>.pt; summary.json names the file and its digest; a run that records nothing still
ends with a (empty) metrics.jsonl, and building a run changes no file of the run before it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.core.digest import state_dict_sha256
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.records.recorder import RunRecorder

needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
FEDAVG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "fedavg.yaml"
TINY = [*conformance.TINY, "data_args.max_train_samples=300", "data_args.max_test_samples=100"]


def _run(tmp_path: Path, monkeypatch, rounds: int):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config(FEDAVG, [*TINY, f"train_args.comm_round={rounds}"])
    return assemble(cfg, tmp_path / "out")


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_building_a_recorder_changes_no_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n')
    recorder = RunRecorder(tmp_path, {})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"round": 0}\n'
    recorder.log_round({"round": 0, "train_loss": 1.0})  # a new run's first record starts the file
    recorder.log_round({"round": 1, "train_loss": 0.5})
    assert [json.loads(x)["train_loss"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1.0,
        0.5,
    ]


@needs_fmnist
def test_a_completed_run_saves_final_model_pt_and_its_digest(tmp_path, monkeypatch, caplog):
    run = _run(tmp_path, monkeypatch, 1)
    out = tmp_path / "out"
    (out / "model_at_failed.pt").write_bytes(b"an earlier run's")
    with caplog.at_level(logging.INFO, logger="fedml_moon.engine.rounds"):
        run.loop.run()
    summary = _summary(out)
    digest = state_dict_sha256(torch.load(out / "final_model.pt", weights_only=True))
    assert summary["model_file"] == "final_model.pt" and summary["final_model_sha256"] == digest
    assert f"final model sha256 {digest}" in caplog.text
    assert not list(out.glob("model_at_*.pt")) and not list(out.glob(".*.tmp"))


@needs_fmnist
@pytest.mark.parametrize(("error", "status"), [(RuntimeError, "failed"), (KeyboardInterrupt, "interrupted")])
def test_a_run_that_stops_before_round_0_saves_model_at_its_status(tmp_path, monkeypatch, error, status):
    run = _run(tmp_path, monkeypatch, 2)
    out = tmp_path / "out"
    for stale in ("final_model.pt", "model_at_interrupted.pt", "model_at_failed.pt"):
        (out / stale).write_bytes(b"an earlier run's")
    (out / "metrics.jsonl").write_text('{"round": 0}\n')

    def train(*args):
        raise error("stopped")

    monkeypatch.setattr(run.loop.trainer, "train", train)
    with pytest.raises(error):
        run.loop.run()
    summary = _summary(out)
    name = f"model_at_{status}.pt"
    assert summary["status"] == status and summary["model_file"] == name
    assert (out / "metrics.jsonl").read_text() == "" and summary["rounds_completed"] == 0
    assert sorted(p.name for p in out.glob("*.pt")) == [name], "no other run's model stays"
    model = torch.load(out / name, weights_only=True)
    assert summary["final_model_sha256"] == state_dict_sha256(model)
    assert all(torch.equal(model[k], v) for k, v in run.model.state_dict().items())  # round 0 never ran
