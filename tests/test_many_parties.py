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
from fedml_moon.data.formats import write_idx
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


def _images(folder: Path, train: int, test: int) -> Path:
    """Random Fashion-MNIST-shaped images and labels as the four idx files."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
        write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
    return folder


def _many(data: Path, parties: int, rounds: int) -> list[str]:
    return [
        "data_args.partition_method=homo",
        f"data_args.data_cache_dir={data}",
        f"train_args.client_num_in_total={parties}",
        "train_args.client_num_per_round=3",
        f"train_args.comm_round={rounds}",
        "train_args.epochs=1",
        "train_args.batch_size=3",
        "train_args.checkpoint_every=1",
        "device_args.using_gpu=false",
        "tracking_args.enable_wandb=false",
    ]


@pytest.mark.slow
def test_a_run_of_20000_parties_completes_and_checkpoints_the_parties_that_trained(tmp_path):
    """20,000 parties of 3 images, 3 a round: the run completes; its log summarises the partition
    (no 20,000-line table), its picture is histograms, and its checkpoint holds only the parties
    sampled so far (a party that never trained is made again from the seed on resume)."""
    from fedml_moon import conformance

    data = _images(tmp_path / "data", 60_000, 40_000)
    config = ROOT / "config" / "fashion_mnist" / "moon.yaml"
    run = conformance.run_mode("standalone", config, _many(data, 20_000, 3), tmp_path / "run", timeout_s=240)
    assert run.ok, run.tail()
    log = run.tail(100_000)
    assert "summarised: 20000 parties" in log and "partition picture (histograms: 20000 parties)" in log
    assert len(log.splitlines()) < 200
    parties = checkpoint_parties(run.out_dir)
    sampled = {p for r in sample_schedule(20_000, 3, 3, 0) for p in r}
    assert parties == sampled
    # every party that exists is a few numbers in columns, not an object: the partition's indices and
    # the server's claims (in its checkpoint too)
    assert (run.out_dir / "partition.json").stat().st_size < 1_000
    with np.load(run.out_dir / "partition.npz", allow_pickle=False) as npz:
        assert npz["train_offsets"].shape == (20_001,) and npz["counts"].shape == (20_000, 10)
    from fedml_moon.core.checkpoint import latest, read_checkpoint

    root = run.out_dir / "checkpoint"
    claims = read_checkpoint(root, latest(root), ("server",))["server"]["claims"]
    assert set(claims) == {"table"} and claims["table"]["samples"].tolist() == [3] * 20_000


def checkpoint_parties(out: Path) -> set[int]:
    """The parties the newest checkpoint of run folder `out` holds a state for."""
    from fedml_moon.core.checkpoint import latest

    round_idx = latest(out / "checkpoint")
    assert round_idx is not None
    return {int(f.stem) for f in (out / "checkpoint" / f"round-{round_idx}" / "parties").iterdir()}


@pytest.mark.slow
def test_a_run_of_many_parties_killed_and_resumed_is_the_same_run(tmp_path):
    """2,000 parties, 3 a round, killed with SIGKILL after its second checkpoint and resumed: the
    same final model and records as the run never stopped, though its checkpoints hold only the
    parties sampled before them."""
    from fedml_moon import conformance
    from tests.support.resume import assert_same_run, kill_when

    data = _images(tmp_path / "data", 20_000, 4_000)
    config, sets = ROOT / "config" / "fashion_mnist" / "moon.yaml", _many(data, 2_000, 8)
    ref = conformance.run_mode("standalone", config, sets, tmp_path / "ref", timeout_s=240)
    assert ref.ok, ref.tail()
    out, env = tmp_path / "killed", conformance.process_env(tmp_path)
    proc = conformance.spawn(
        conformance.cli_command("simulate", config, sets, out), tmp_path / "a.log", env, tmp_path
    )
    kill_when(proc, out, 2, random.uniform(0.0, 0.5))
    assert len(checkpoint_parties(out)) < 2_000
    again = [*conformance.cli_command("simulate", config, sets, out), "--resume", str(out)]
    proc = conformance.spawn(again, tmp_path / "b.log", env, tmp_path)
    assert conformance.wait_all([proc], 240) == [0], (tmp_path / "b.log").read_text()[-3000:]
    assert_same_run(ref.out_dir, out)


@needs_fmnist
@pytest.mark.slow
def test_a_sample_of_the_parties_tests_their_models_and_the_same_sample_in_every_mode(tmp_path):
    """validation_args.eval_parties 2 of 4 parties: every evaluated round records a local test over
    2 parties (`eval_parties`), drawn from the seed, so the standalone run, the MPI simulation and
    gRPC cross-silo (where only the sampled parties' silos are asked) record the same figures."""
    from fedml_moon import conformance

    config = ROOT / "config" / "fashion_mnist" / "moon.yaml"
    sets = [*TINY, "train_args.client_num_in_total=4", "validation_args.eval_parties=2"]
    runs = [conformance.run_mode(m, config, sets, tmp_path / m) for m in ("standalone", "mpi-simulation")]
    runs.append(conformance.run_mode("cross-silo-grpc", config, sets, tmp_path / "grpc"))
    for run in runs:
        assert run.ok, run.tail()
    records = [json.loads(x) for x in (runs[0].out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("eval_parties") for r in records] == [2, 2, 2] and all(
        "local_test_acc" in r for r in records
    )
    for other in runs[1:]:
        diff, differences = conformance.compare(runs[0], other)
        assert diff <= 1e-5 and not differences, (other.mode, diff, differences)
    every = conformance.run_mode("standalone", config, [*sets[:-1]], tmp_path / "every")
    assert every.ok and all("eval_parties" not in json.loads(x) for x in _lines(every.out_dir))


def _lines(out: Path) -> list[str]:
    return (out / "metrics.jsonl").read_text().splitlines()


@needs_fmnist
def test_a_party_that_trained_after_the_checkpoint_restored_is_back_at_its_start(tmp_path):
    """A worker that lives on while its server restarts loads the checkpoint, which holds only the
    parties that had trained: a party that trained after it loses its state and its stream's moves,
    so it trains again exactly as it did the first time."""
    config = ROOT / "config" / "fashion_mnist" / "moon.yaml"
    with quiet_run(config, [*TINY, "train_args.state_store=memory"], tmp_path / "run") as run:
        runner, server = run.loop.runner, run.loop.server
        downloads = server.downloads(0)
        first, second = list(downloads)[:2]
        runner.train(first, downloads[first], 0)
        checkpoint = {str(p): runner.state([p])[p] for p in runner.trained}
        _, before = runner.train(second, downloads[second], 0)
        runner.load_state(checkpoint)
        assert runner.trained == {first} and not runner.trainer.store.get(second)
        _, again = runner.train(second, downloads[second], 0)
    assert all(torch.equal(before["model"][k], again["model"][k]) for k in before["model"])
