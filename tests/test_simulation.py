"""The standalone loop in-process: failures keep what was computed; evaluation frequency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
SMALL = [
    "data_args.max_train_samples=1000",
    "data_args.max_test_samples=200",
    "train_args.epochs=1",
    "tracking_args.enable_wandb=false",
]


def small_run(tmp_path: Path, monkeypatch, *extra: str):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config("config/fashion_mnist/fedavg.yaml", [*SMALL, *extra])
    return assemble(cfg, tmp_path / "out")


def test_failure_mid_run_keeps_metrics_and_writes_summary(tmp_path, monkeypatch):
    run = small_run(tmp_path, monkeypatch, "train_args.comm_round=3")
    real_train = run.loop.trainer.train

    def train(data, device, args):
        if args.round_idx == 1:
            raise RuntimeError("disk full")
        return real_train(data, device, args)

    monkeypatch.setattr(run.loop.trainer, "train", train)
    with pytest.raises(RuntimeError, match="disk full"):
        run.loop.run()
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["final_round"] == 0


def test_evaluates_every_n_rounds_and_the_last_and_records_every_round(tmp_path, monkeypatch):
    run = small_run(
        tmp_path, monkeypatch, "train_args.comm_round=5", "validation_args.frequency_of_the_test=2"
    )
    run.loop.run()
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 1, 2, 3, 4]  # every round is recorded
    evaluated = [r["round"] for r in records if "test_acc" in r]
    assert evaluated == [0, 2, 4]  # FedML's rule: round % n == 0, and the last round
    for r in records:  # what every round has, evaluated or not
        assert r["train_loss"] > 0 and r["ce"] > 0 and r["round_time_s"] > 0 and r["parties"] == 10
        assert ("test_loss" in r) == (r["round"] in evaluated)
    ups = [r["bytes_up"] for r in records]
    assert ups == [ups[0] * (i + 1) for i in range(5)]  # cumulative, no round's traffic lost
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 5
    assert summary["final_round"] == 4 and summary["best_round"] in evaluated


def test_more_parties_than_samples_is_a_config_error(tmp_path, monkeypatch):
    from fedml_moon.config.load import ConfigError

    with pytest.raises(ConfigError, match="raise it to >= 2000 or lower train_args.client_num_in_total"):
        small_run(tmp_path, monkeypatch, "train_args.client_num_in_total=200")
    over = ["data_args.max_train_samples=null", "train_args.client_num_in_total=7000"]
    with pytest.raises(ConfigError, match="^train_args.client_num_in_total") as err:
        small_run(tmp_path, monkeypatch, *over)
    assert "need 70000 samples, but only 60000" in str(err.value)


def test_a_run_builds_every_loader_for_its_device(tmp_path, monkeypatch):
    run = small_run(tmp_path, monkeypatch, "train_args.comm_round=1")
    _, _, train_global, test_global, _, train_local, test_local, _ = run.dataset
    loaders = [train_global, test_global, *train_local.values(), *test_local.values()]
    assert all(loader.device == run.device for loader in loaders)
    assert all(loader.plain().device == run.device for loader in train_local.values())
