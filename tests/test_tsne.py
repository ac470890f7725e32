"""t-SNE of a run's representations from the models it saved: the final global model and, with
`train_args.save_party_models`, each party's latest upload (written as it arrives)."""

from __future__ import annotations

import logging
import signal

import numpy as np
import pytest
import torch

from fedml_moon.adapters.run import assemble
from fedml_moon.cli import main
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.results import tsne as tsne_module
from fedml_moon.results.tsne import embed, figure, rows, tsne

needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
TINY = [
    "data_args.max_train_samples=400",
    "data_args.max_test_samples=120",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=2",
    "train_args.epochs=1",
    "tracking_args.enable_wandb=false",
    "device_args.torch_threads=1",
]


@pytest.mark.slow
@needs_fmnist
def test_tsne_of_the_global_and_a_partys_saved_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config("config/fashion_mnist/moon.yaml", [*TINY, "train_args.save_party_models=true"])
    run = assemble(cfg, tmp_path / "run")
    run.loop.run()
    saved = sorted(p.name for p in (tmp_path / "run" / "party_models").iterdir())
    sampled = {p for r in range(2) for p in run.loop.server.parties(r)}
    assert saved == sorted(f"party_{p}.pt" for p in sampled)  # every party that uploaded, no more
    party = min(sampled)
    state = torch.load(tmp_path / "run" / "party_models" / f"party_{party}.pt", weights_only=True)
    assert state.keys() == run.loop.aggregator.model.state_dict().keys()
    # through the command line: `fedml-moon tsne RUN_DIR --party K`
    argv = ["tsne", str(tmp_path / "run"), "--party", str(party), "--samples", "100"]
    assert _main(argv) == 0
    assert (tmp_path / "run" / "tsne.png").stat().st_size > 10_000
    capsys.readouterr()
    assert _main(["tsne", str(tmp_path / "run"), "--party", "99", "--samples", "50"]) == 2
    assert "save_party_models: true" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="save_party_models: true"):
        tsne(tmp_path / "run", 99, samples=50)


@pytest.mark.slow
@needs_fmnist
def test_tsne_of_two_runs_is_one_picture_with_a_row_per_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    one_round = [*TINY, "train_args.comm_round=1", "train_args.client_num_per_round=3"]
    for algorithm, seed in (("fedavg", 0), ("moon", 1)):  # seed 1: the embedding takes the first run's
        overrides = [*one_round, "train_args.save_party_models=true", f"common_args.random_seed={seed}"]
        cfg = load_config(f"config/fashion_mnist/{algorithm}.yaml", overrides)
        assemble(cfg, tmp_path / algorithm).loop.run()
    runs = [tmp_path / "fedavg", tmp_path / "moon"]
    seeds = []

    def embed_seen(features: np.ndarray, seed: int) -> np.ndarray:
        seeds.append(seed)
        return embed(features, seed)

    monkeypatch.setattr(tsne_module, "embed", embed_seen)
    drawn = rows(runs, party=0, samples=60)
    assert seeds == [0, 0, 0, 0]  # every panel with the first run's seed
    fig = figure(drawn)
    assert [ax.get_title() for ax in fig.axes] == [
        "fedavg: global model",
        "fedavg: party 0's local model",
        "moon: global model",
        "moon: party 0's local model",
    ]
    assert [ax.get_ylabel() for ax in fig.axes[::2]] == ["fedavg", "moon"]  # each row names its run
    assert fig.get_suptitle() == "fedavg vs moon on fashion-mnist"
    assert all(p.points.shape == (60, 2) and len(p.labels) == 60 for row in drawn for p in row.panels)
    # through the command line: several folders, --out
    out = tmp_path / "both.png"
    argv = ["tsne", *map(str, runs), "--party", "0", "--samples", "60", "--out", str(out)]
    assert _main(argv) == 0
    assert out.stat().st_size > 10_000
    assert not (tmp_path / "fedavg" / "tsne.png").exists()


def _main(argv: list[str]) -> int:
    """fedml_moon.cli.main, with what it sets process-wide (logging, SIGTERM) put back."""
    root = logging.getLogger()
    handlers, level, sigterm = root.handlers[:], root.level, signal.getsignal(signal.SIGTERM)
    try:
        return main(argv)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        signal.signal(signal.SIGTERM, sigterm)


def test_the_embedding_separates_what_is_separate():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 16, generator=g).numpy()
    b = a + 50.0  # two far-apart clusters stay apart in 2-d
    points = embed(np.concatenate([a, b]), seed=0)
    assert points.shape == (80, 2)
    gap = abs(points[:40].mean(0) - points[40:].mean(0)).max()
    assert gap > 3 * max(points[:40].std(0).max(), points[40:].std(0).max())
