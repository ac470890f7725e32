"""Many parties, few sampled: a party's loader is made when the party is asked for and let go of after
(`data.lazy.PartyLoaders`), its random stream carried over, so a run draws the batches of loaders
made at start-up and held all along, and ends with the same model; checkpoints hold the parties that
trained, and a party sampled again many rounds later finds its own MOON pool and SCAFFOLD control
variate. A run of 20,000 parties completes in seconds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from fedml_moon.conformance import TINY
from fedml_moon.conformance.inprocess import quiet_run
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.lazy import PartyLoaders
from fedml_moon.data.loader import PartyLoader

ROOT = Path(__file__).resolve().parent.parent
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)


def _mapping(keep: int) -> PartyLoaders:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (60, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (60,), generator=g)
    parts = np.array_split(np.arange(60), 6)

    def make(i: int, party: int) -> PartyLoader:
        return PartyLoader(
            images, labels, parts[i], 4, shuffle=True, augment="cifar10", seed=3, party_id=party
        )

    return PartyLoaders(range(6), make, keep)


def test_a_party_let_go_draws_the_batches_of_a_loader_held_all_along():
    """Thirty rounds of two parties of six: with one loader held at a time (every party's loader let
    go of between its rounds, the shuffle and augmentation streams carried over) each batch equals,
    bit for bit, the one of a mapping that holds every loader."""
    held, let_go, rng = _mapping(keep=100), _mapping(keep=1), random.Random(0)
    for _ in range(30):
        for party in rng.sample(range(6), 2):
            for (x1, y1), (x2, y2) in zip(held[party], let_go[party], strict=True):
                assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert let_go.held() == 1 and held.held() == 6
    assert len(let_go) == 6 and list(let_go) == list(range(6)) and 5 in let_go and 6 not in let_go
    with pytest.raises(KeyError):
        let_go[6]


def _run(tmp_path: Path, algorithm: str, keep: int, monkeypatch, extra: list[str]) -> tuple[dict, Path]:
    monkeypatch.setattr("fedml_moon.data.lazy.KEEP", keep)
    out = tmp_path / f"{algorithm}-{keep}"
    config = ROOT / "config" / "fashion_mnist" / f"{algorithm}.yaml"
    with quiet_run(config, [*TINY, *extra], out) as run:
        run.loop.run()
        store = run.loop.runner.trainer.store
        states = {p: store.get(p) for p in range(run.loop.server.n_parties)}
    model = torch.load(out / "final_model.pt", weights_only=True)
    return {"model": model, "states": states}, out


MANY = [
    "train_args.client_num_in_total=30",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=20",
    "train_args.checkpoint_every=0",
    "train_args.state_store=memory",
    "validation_args.local_test=false",
    "validation_args.frequency_of_the_test=20",
    "data_args.max_train_samples=600",
]


@needs_fmnist
@pytest.mark.parametrize("algorithm", ["moon", "scaffold"])
def test_loaders_made_when_sampled_end_where_loaders_held_all_along_end(tmp_path, monkeypatch, algorithm):
    """30 parties, 2 a round, 20 rounds: with one loader held (every sampled party's made anew) the
    final model and every party's state are those of the run that holds every loader. A party
    sampled again rounds later keeps its own state from its last round: MOON's pool is its model of
    that round, SCAFFOLD's c_i is there, and a party never sampled has none."""
    eager, _ = _run(tmp_path, algorithm, 10_000, monkeypatch, MANY)
    lazy, out = _run(tmp_path, algorithm, 1, monkeypatch, MANY)
    assert all(torch.equal(eager["model"][k], t) for k, t in lazy["model"].items())
    schedule = sample_schedule(30, 2, 20, 0)
    last = {p: r for r, parties in enumerate(schedule) for p in parties}
    rounds = {p: [r for r, parties in enumerate(schedule) if p in parties] for p in last}
    assert max(b - a for r in rounds.values() for a, b in zip(r, r[1:], strict=False)) >= 10  # a long wait
    for party in range(30):
        one, two = eager["states"][party], lazy["states"][party]
        assert json.dumps(_shapes(one)) == json.dumps(_shapes(two))
        if party not in last:
            assert not two
        elif algorithm == "moon":
            assert two["pool_rounds"] == [last[party]]
        else:
            assert set(two["c"]) and all(torch.equal(one["c"][k], two["c"][k]) for k in two["c"])


def _shapes(state: dict) -> dict:
    return {k: (list(v) if isinstance(v, list) else sorted(v)) for k, v in state.items() if k != "pool"}
