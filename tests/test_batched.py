"""Parties trained together give the model the sequential path gives: the functional SGD step is
torch.optim.SGD's; every registered algorithm, with unequal parties and sampling, ends 2 rounds (MOON
also 4, with pools of different lengths, and with its l2 term) within 1e-4 of the sequential run;
BatchNorm statistics stay per party; a contributed algorithm that writes only its loss and a step
hook trains batched with no extra code."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedml_moon.adapters.run import assemble
from fedml_moon.algorithms.base import ClientAlgorithm, Context, PartyRound, add_rows
from fedml_moon.config.load import load_config
from fedml_moon.core.batched import StackedSGD, auto_parties
from fedml_moon.core.models import build_model
from fedml_moon.core.validate import tensor_leaves
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.loader import FedMLDataset
from fedml_moon.engine.batched import PartyJob, train_parties, train_party
from fedml_moon.registry import ALGORITHMS, load_plugins
from tests.support.tiny import train_args

needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
CONFIG = {"fedprox_head": "config/fashion_mnist/fedprox.yaml"}  # the contributor kit's example
EXTRA = {
    "lg": ["data_args.partition_method=hetero", "algorithm_args.warmup_rounds=1"],
    "moon": ["algorithm_args.pool_size=2"],  # pools of different lengths under sampling
    "scaffold": ["algorithm_args.correction=gradient"],
}
SMALL = [  # 5 parties of unequal sizes (Dir 0.5), 4 sampled per round, 2 rounds, last batches partial
    "data_args.max_train_samples=900",
    "data_args.max_test_samples=200",
    "train_args.client_num_in_total=5",
    "train_args.client_num_per_round=4",
    "train_args.comm_round=2",
    "train_args.epochs=2",
    "train_args.batch_size=32",
    "train_args.drop_last=false",
    "train_args.learning_rate=0.05",
    "tracking_args.enable_wandb=false",
    "device_args.torch_threads=1",
]


def test_the_stacked_sgd_step_is_torch_sgd_exactly():
    torch.manual_seed(0)
    k, shapes = 3, [(4, 5), (7,)]
    starts = [[torch.randn(s) for s in shapes] for _ in range(k)]
    grads = [[[torch.randn(s) for s in shapes] for _ in range(k)] for _ in range(4)]
    active = [None, torch.tensor([0, 2]), torch.tensor([1]), None]  # party 1 skips step 1, 0 and 2 step 3
    stacked = {str(i): torch.stack([starts[p][i] for p in range(k)]) for i in range(len(shapes))}
    sgd = StackedSGD(stacked, lr=0.05, momentum=0.9, weight_decay=1e-3)
    for step, rows in enumerate(active):
        for i in range(len(shapes)):
            stacked[str(i)].grad = torch.stack([grads[step][p][i] for p in range(k)])
        sgd.step(rows)
    for p in range(k):
        params = [t.clone().requires_grad_() for t in starts[p]]
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
        for step, rows in enumerate(active):
            if rows is None or p in rows.tolist():
                for param, g in zip(params, grads[step][p], strict=True):
                    param.grad = g.clone()
                opt.step()
        for i, param in enumerate(params):
            assert torch.equal(stacked[str(i)][p], param.detach()), f"party {p}, tensor {i}"


def _run(tmp_path, monkeypatch, algorithm: str, parallel: int, extra: tuple = ()):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = CONFIG.get(algorithm, f"config/fashion_mnist/{algorithm}.yaml")
    overrides = [*SMALL, f"train_args.algorithm={algorithm}", f"train_args.parties_in_parallel={parallel}"]
    cfg = load_config(config, [*overrides, *EXTRA.get(algorithm, []), *extra])
    run = assemble(cfg, tmp_path / f"k{parallel}")
    run.loop.run()
    return run


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a if a[n].is_floating_point())


@needs_fmnist
@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [(name, ()) for name in sorted({*ALGORITHMS, *load_plugins()})]
    + [("scaffold", ("algorithm_args.correction=after-step",))]  # the default; EXTRA tests "gradient"
    + [("moon", ("algorithm_args.representation_loss=l2",))]  # ||z - z_glob|| at 0: one definition
    + [("moon", ("train_args.comm_round=4",))],  # 4 of 5 sampled: pools of lengths 0, 1 and 2 stack apart
)
def test_batched_parties_end_where_sequential_ones_do(algorithm, extra, tmp_path, monkeypatch, caplog):
    seq = _run(tmp_path, monkeypatch, algorithm, 1, extra)
    with caplog.at_level(logging.INFO, logger="fedml_moon.engine.parties"):
        bat = _run(tmp_path, monkeypatch, algorithm, 4, extra)
    assert "parties trained together (batched)" in caplog.text  # the plugin's too: one form, no fallback
    a, b = seq.loop.aggregator.model.state_dict(), bat.loop.aggregator.model.state_dict()
    assert _max_diff(a, b) <= 1e-4
    store_a, store_b = seq.loop.runner.trainer.store, bat.loop.runner.trainer.store
    for party in range(5):
        flat_a, flat_b = dict(tensor_leaves(store_a.get(party))), dict(tensor_leaves(store_b.get(party)))
        assert flat_a.keys() == flat_b.keys()
        for key in flat_a:
            assert float((flat_a[key].double() - flat_b[key].double()).abs().max()) <= 1e-4, (party, key)


def test_parties_whose_shared_context_is_equal_but_copied_train_together():
    """One copy of the server's prototypes per party (moved to the device per party) still stacks;
    other values do not."""
    from fedml_moon.engine.grouping import groups

    protos = torch.randn(4, 3)

    def job(party: int, shared: torch.Tensor) -> PartyJob:
        return PartyJob(PartyRound({}, {}, 0, party, ()), [], Context({}, 0.1, {"protos": shared}))

    jobs = [job(0, protos), job(1, protos.clone()), job(2, protos + 1), job(3, protos.clone())]
    assert [[j.party for j in g] for g in groups(jobs)] == [[0, 1, 3], [2]]


def _names(factory) -> tuple[str, ...]:
    return tuple(n for n, p in factory().named_parameters() if p.requires_grad)


def _loader(n: int, batch: int, seed: int, side: int = 16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, side, side, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (n,), generator=g)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]


def test_batchnorm_statistics_stay_with_their_party_resnet50():
    """In float64: ResNet-50 on tiny random batches is chaotic (a 1e-7 change of the weights moves
    BatchNorm statistics by ~1 within 3 steps), so float32 rounding alone would separate the paths."""
    torch.manual_seed(0)

    def factory():
        return build_model("resnet50", (3, 16, 16), 4, use_head=False).double()

    algo = ClientAlgorithm(None, train_args(epochs=1, batch_size=4, learning_rate=0.01), factory, 0)
    start = factory().state_dict()
    loaders = [_loader(8, 4, 1), _loader(4, 4, 2), _loader(6, 4, 3)]  # 2, 1, 2 batches (one of 2 samples)
    jobs = [PartyJob(PartyRound({"model": start}, {}, 0, p, _names(factory)), loaders[p]) for p in range(3)]
    results = train_parties(algo, factory(), jobs, torch.device("cpu"))
    finals = []
    for p, job in enumerate(jobs):
        model = factory()
        metrics, _ = train_party(algo, model, {"model": start}, {}, loaders[p], torch.device("cpu"), 0, p)
        assert job.steps == len(loaders[p]) and _max_diff(model.state_dict(), job.final) <= 1e-9
        assert results[p][0]["loss"] == pytest.approx(metrics["loss"], rel=1e-9)
        finals.append(job.final)
    bn = "encoder.net.layer4.2.bn3"
    assert [int(f[f"{bn}.num_batches_tracked"]) for f in finals] == [2, 1, 2]
    means = [f[f"{bn}.running_mean"] for f in finals]  # each party's own statistics
    assert not torch.allclose(means[0], means[1]) and not torch.allclose(means[0], means[2])


class _OwnLoss(ClientAlgorithm):
    """A contributed algorithm: its own loss and a step hook (decoupled weight shrinkage on the
    classifier), nothing else; it trains batched with no extra code."""

    name = "own-loss"

    def context(self, r):
        return Context(r.received["model"], self.train_args.learning_rate, {}, {"shrink": torch.tensor(0.1)})

    def loss(self, net, x, y, ctx):
        ce = F.cross_entropy(net(x).logits, y) * 2
        return ce, {"ce": ce.detach()}

    def after_step(self, params, ctx, rows, lr):
        w = params["classifier.weight"]
        add_rows(w, w * ctx["shrink"].view(-1, 1, 1) * -lr, rows, 1.0)


def test_moon_teachers_over_batchnorm_train_batched_as_sequentially_resnet50():
    """MOON's teachers (the global model and a previous one, eval mode, BatchNorm from their running
    statistics) beside a student whose BatchNorm trains per party: batched = sequential, in float64
    (see the test above for why)."""
    from fedml_moon.algorithms.moon import MoonClient, MoonOptions

    torch.manual_seed(0)

    def factory():
        return build_model("resnet50", (3, 8, 8), 4, out_dim=32).double()

    train = train_args(epochs=1, batch_size=4, learning_rate=0.01)
    algo = MoonClient(MoonOptions(mu=1.0), train, factory, 0)
    start, previous = factory().state_dict(), factory().state_dict()
    loaders = [_loader(8, 4, 1, side=8), _loader(3, 4, 2, side=8)]  # 2 batches; 1 of 3 samples
    names = _names(factory)
    jobs = [
        PartyJob(PartyRound({"model": start}, {"pool": [previous]}, 1, p, names), loaders[p])
        for p in range(2)
    ]
    results = train_parties(algo, factory(), jobs, torch.device("cpu"))  # round 1: the pool is used
    for p, job in enumerate(jobs):
        model, state = factory(), {"pool": [previous]}
        metrics, _ = train_party(algo, model, {"model": start}, state, loaders[p], torch.device("cpu"), 1, p)
        assert _max_diff(model.state_dict(), job.final) <= 1e-9, p
        assert results[p][0]["l_con"] == pytest.approx(metrics["l_con"], rel=1e-9) and metrics["l_con"] > 0


def test_a_contributed_algorithm_trains_batched_as_sequentially_with_no_extra_code(caplog):
    from fedml_moon.adapters.trainer import PluginClientTrainer
    from fedml_moon.core.state import make_store
    from fedml_moon.engine.parties import PartyRunner

    def factory():
        return build_model("mlp", (1, 4, 4), 3, use_head=False)

    args = train_args(batch_size=4, epochs=2)

    class _Data(list):
        def __init__(self, items, party):
            super().__init__(items)
            self.party_id = party

    g = torch.Generator().manual_seed(0)
    loaders = [
        _Data([(torch.randn(4, 1, 4, 4, generator=g), torch.randint(0, 3, (4,), generator=g))] * (p + 1), p)
        for p in range(3)
    ]
    dataset = FedMLDataset(0, 0, None, None, dict(enumerate([4, 8, 12])), loaders, loaders, 4)

    class _Args:
        round_idx = 0

    torch.manual_seed(0)
    start = {"model": factory().state_dict()}
    outs = []
    for parallel in (1, 3):
        trainer = PluginClientTrainer(
            factory(), _Args(), _OwnLoss(None, args, factory, 0), make_store("memory", None)
        )
        runner = PartyRunner(trainer, dataset, torch.device("cpu"), _Args(), parallel)
        with caplog.at_level(logging.INFO, logger="fedml_moon.engine.parties"):
            outs.append(runner.train_many([(p, start) for p in range(3)], 0))
    assert "3 parties trained together (batched)" in caplog.text
    for (_, a), (_, b) in zip(*outs, strict=True):
        assert _max_diff(a["model"], b["model"]) <= 1e-6
        assert _max_diff(a["model"], start["model"]) > 1e-3  # they trained
        assert a["metrics"]["ce"] == pytest.approx(b["metrics"]["ce"], rel=1e-5)


def test_auto_picks_every_party_when_memory_allows_and_fewer_when_not(monkeypatch):
    import fedml_moon.core.batched as batched

    model = build_model("simple-cnn", (1, 28, 28), 10)
    assert auto_parties(model, (64, 1, 28, 28), torch.device("cpu"), 10) == 10
    monkeypatch.setattr(batched, "free_memory", lambda device: 60 * 2**20)
    k = auto_parties(model, (64, 1, 28, 28), torch.device("cpu"), 10)
    assert 1 <= k < 10


@needs_fmnist
@pytest.mark.slow
def test_mpi_simulation_workers_train_their_parties_batched(tmp_path):
    """5 parties on 2 MPI workers (4 sampled per round): each worker stacks the parties it is given;
    the run ends where the sequential standalone run does."""
    from fedml_moon import conformance

    config = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
    overrides = [*conformance.TINY, "train_args.client_num_in_total=5", "train_args.client_num_per_round=4"]
    ref = conformance.run_mode("standalone", config, overrides, tmp_path / "seq")
    run = conformance.run_mode(
        "mpi-simulation", config, [*overrides, "train_args.parties_in_parallel=4"], tmp_path
    )
    assert ref.ok and run.ok, run.tail()
    diff, _ = conformance.compare(ref, run)
    assert diff <= 1e-4
    logs = "".join(path.read_text() for path in run.logs)
    assert "parties trained together (batched)" in logs


@needs_fmnist
def test_a_chunk_out_of_device_memory_is_trained_again_in_halves(tmp_path, monkeypatch, caplog):
    """An out-of-memory error in a chunk of parties trained together is retried with half as many,
    from the same random streams and party states, and the smaller size is kept: the run ends as one
    run with 2 at a time does. The error is injected (trainer.train_many raises torch.OutOfMemoryError,
    what CUDA raises, for more than 2 parties), since a real one cannot be had on demand here."""
    from fedml_moon.adapters.trainer import PluginClientTrainer

    plain = _run(tmp_path / "plain", monkeypatch, "moon", 2)
    real = PluginClientTrainer.train_many
    chunks: list[int] = []

    def tight(self, loaders, *args):
        chunks.append(len(loaders))
        if len(loaders) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, loaders, *args)

    monkeypatch.setattr(PluginClientTrainer, "train_many", tight)
    with caplog.at_level(logging.WARNING, logger="fedml_moon.engine.parties"):
        retried = _run(tmp_path / "retried", monkeypatch, "moon", 4)
    assert chunks == [4, 2, 2, 2, 2]  # round 0: 4 fails, then 2 + 2; round 1: 2 + 2
    assert "ran out of memory on cpu trained together; training 2 at a time from now on" in caplog.text
    assert (
        _max_diff(plain.loop.aggregator.model.state_dict(), retried.loop.aggregator.model.state_dict()) == 0
    )
