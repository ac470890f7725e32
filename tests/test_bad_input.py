"""Bad input gets one clear message and loses nothing: a NaN update is named and left out (or stops
the run, by config), a model that does not fit the data and an unreadable data folder are named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedml_moon import registry
from fedml_moon.adapters.run import assemble
from fedml_moon.algorithms.base import NoOptions, ServerAlgorithm
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.core.validate import BadUpload
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.dataset_files import write_mnist

ROOT = Path(__file__).resolve().parent.parent
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
SMALL = [
    "data_args.max_train_samples=600",
    "data_args.max_test_samples=200",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=3",
    "train_args.comm_round=3",
    "train_args.epochs=1",
    "train_args.checkpoint_every=1",
    "tracking_args.enable_wandb=false",
]


class DivergesOnParty1(FedAvgClient):
    """Party 1's training blows up in round 1 (the model it uploads turns NaN)."""

    def finish(self, r, ctx, done):
        payload = super().finish(r, ctx, done)
        if r.party == 1 and r.round_idx == 1:
            with torch.no_grad():
                payload["model"][r.trainable[0]].fill_(float("nan"))
        return payload


@pytest.fixture
def diverging(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = registry.AlgorithmSpec("diverges", DivergesOnParty1, ServerAlgorithm, NoOptions, "test")
    monkeypatch.setattr(registry, "ALGORITHMS", {**registry.ALGORITHMS, "diverges": spec})


@needs_fmnist
def test_a_nan_update_is_named_and_left_out(diverging, tmp_path, caplog):
    run = assemble(
        load_config(ROOT / "config/fashion_mnist/fedavg.yaml", [*SMALL, "train_args.algorithm=diverges"]),
        tmp_path / "o",
    )
    run.loop.run()
    records = [json.loads(x) for x in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("rejected_parties") for r in records] == [None, [1], None]
    assert records[1]["parties"] == 2 and all(
        torch.isfinite(v).all() for v in run.loop.aggregator.global_state.values() if v.is_floating_point()
    )
    assert "party 1's upload is left out" in caplog.text and "NaN or Inf" in caplog.text


@needs_fmnist
def test_a_nan_update_can_stop_the_run_keeping_what_was_computed(diverging, tmp_path):
    overrides = [*SMALL, "train_args.algorithm=diverges", "train_args.on_bad_upload=stop"]
    run = assemble(load_config(ROOT / "config/fashion_mnist/fedavg.yaml", overrides), tmp_path / "o")
    with pytest.raises(BadUpload, match="round 1: .*NaN or Inf.*on_bad_upload: stop"):
        run.loop.run()
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 1
    assert (tmp_path / "o" / "checkpoint" / "LATEST").read_text() == "0"


@needs_fmnist
def test_a_model_that_does_not_fit_the_data_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(
        ROOT / "config/fashion_mnist/moon.yaml",
        [*SMALL, "model_args.model=simple-cnn", "data_args.dataset=fashion-mnist"],
    )
    monkeypatch.setattr("fedml_moon.adapters.run.build_model", _refuse_28)
    with pytest.raises(ConfigError, match=r"model_args.model: .* \(the data's inputs: 1x28x28, channels x"):
        assemble(cfg, tmp_path / "o")


def _refuse_28(*args, **kwargs):
    raise ValueError("simple-cnn takes 32x32 images; got 28x28")


LOAD = """
import sys
from fedml_moon.data.datasets import load_dataset
try:
    load_dataset("fashion-mnist", sys.argv[1])
except Exception as err:
    print(type(err).__name__, err)
"""


@pytest.mark.slow
def test_a_data_folder_without_read_permission_is_named(tmp_path):
    """Through the real loader; as root, with the capabilities that bypass file permissions dropped."""
    folder = tmp_path / "data"
    write_mnist(folder, gz=True)
    os.chmod(folder, 0o000)
    cmd = [sys.executable, "-c", LOAD, str(folder)]
    if os.geteuid() == 0:
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(folder, 0o755)
    assert "DataFileError" in proc.stdout, proc.stdout + proc.stderr
    assert "permission denied; give the user running this read access" in proc.stdout
