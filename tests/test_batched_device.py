"""Batched parties on the run's device: two rounds of every built-in algorithm driven through the pure
core (server half, party half, loaders built for the device with the data set resident there), batched
against one-after-another, within 1e-4. CUDA cases run where a GPU is; the CPU case keeps the plumbing of
this loop (resident loaders, device moves) tested everywhere. Nothing here imports FedML, so these tests
also run on machines that have a GPU but no FedML."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import pytest
import torch

from fedml_moon.algorithms.base import PartyRound
from fedml_moon.config.load import load_config
from fedml_moon.core.models import build_model
from fedml_moon.core.partition import dirichlet_partition
from fedml_moon.data.datasets import DatasetTensors
from fedml_moon.data.loader import build_fedml_dataset
from fedml_moon.engine.batched import PartyJob, train_parties, train_party
from fedml_moon.registry import get_algorithm
from tests.support.marks import CUDA_ONLY, cuda_only

BUILT_IN = ("fedavg", "fedprox", "fedssc", "lg", "moon", "scaffold", "solo")
CUDA = cuda_only
PARTIES, SAMPLED = 5, (0, 1, 3, 4)


def _data(augment: str = "none") -> DatasetTensors:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (700, 1, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (700,), generator=g)
    return DatasetTensors("fashion-mnist", x, y, x[:50], y[:50], 10, (0.28,), (0.35,), augment)


def _round_trip(
    algorithm: str,
    device: torch.device,
    parallel: bool,
    graphs: bool = False,
    augment: str = "none",
    sets: tuple[str, ...] = ("train_args.cuda_graphs=false",),
) -> tuple[dict, list[dict]]:
    """Two rounds (parties 0, 1, 3, 4 sampled; partial last batches); the final global model and every
    party's state. `graphs`: the batched steps of full batches go through the masked step; `sets`:
    more overrides (by default the eager step, on CUDA too)."""
    overrides = ["train_args.epochs=2", "train_args.batch_size=32", "train_args.learning_rate=0.05", *sets]
    if graphs:
        overrides += ["train_args.parties_in_parallel=4", "train_args.cuda_graphs=true"]
    cfg = load_config(f"config/fashion_mnist/{algorithm}.yaml", overrides)
    train, m, data = cfg.train_args, cfg.model_args, _data(augment)
    parts = dirichlet_partition(data.y_train.numpy(), PARTIES, 0.5, seed=0)
    loaders = build_fedml_dataset(
        data, parts, None, 32, 0, False, device=device, resident=device.type == "cuda"
    )
    spec = get_algorithm(algorithm)

    def factory() -> torch.nn.Module:
        return build_model(m.model, (1, 28, 28), 10, m.use_projection_head, m.out_dim, m.output_activation)

    torch.manual_seed(0)
    model = factory().to(device)
    client = spec.client(cfg.algorithm_args, train, factory, 0)
    server = spec.server(cfg.algorithm_args, cfg.server_args, train, 0)
    global_state = server.setup(copy.deepcopy(model.state_dict()))
    states: list[dict] = [{} for _ in range(PARTIES)]
    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    for round_idx in range(2):
        rounds = [
            PartyRound(server.download(global_state, p), states[p], round_idx, p, names) for p in SAMPLED
        ]
        data = [loaders.train_data_local_dict[p] for p in SAMPLED]
        if parallel:
            jobs = [PartyJob(r, d) for r, d in zip(rounds, data, strict=True)]
            uploads = [u for _, u in train_parties(client, model, jobs, device)]
        else:
            uploads = [
                train_party(client, model, r.received, r.state, d, device, round_idx, r.party)[1]
                for r, d in zip(rounds, data, strict=True)
            ]
        weights = [float(len(parts[p])) for p in SAMPLED]
        global_state = server.aggregate(global_state, list(zip(weights, uploads, strict=True)))
    return global_state, states


def _leaves(tree: object, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _leaves(sub, f"{prefix}/{key}").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, sub in enumerate(tree) for k, v in _leaves(sub, f"{prefix}/{i}").items()}
    return {}


def _check(algorithm: str, device: torch.device, graphs: bool = False, augment: str = "none") -> None:
    seq = _round_trip(algorithm, device, parallel=False, augment=augment)
    bat = _round_trip(algorithm, device, parallel=True, graphs=graphs, augment=augment)
    for key, diff in _distances(seq, bat).items():
        assert diff <= 1e-4, (algorithm, key, diff)


def _distances(a: tuple, b: tuple) -> dict[str, float]:
    """Max absolute difference per floating-point leaf of two (model, states) results."""
    one, two = _leaves({"model": a[0], "states": a[1]}), _leaves({"model": b[0], "states": b[1]})
    assert one.keys() == two.keys()
    return {
        key: float((t.double().cpu() - two[key].double().cpu()).abs().max())
        for key, t in one.items()
        if t.is_floating_point()
    }


def test_the_stacked_parties_train_on_the_device_of_their_batches() -> None:
    """On `meta` tensors (no arithmetic, real devices checks): starts, stacked weights, SGD state and
    the parties' final models all live on the run's device, for a CPU-only check of the CUDA path."""
    from fedml_moon.algorithms.moon import MoonClient, MoonOptions
    from fedml_moon.engine.batched import prepare, train_group
    from fedml_moon.engine.grouping import groups
    from tests.support.tiny import train_args

    meta = torch.device("meta")

    def factory() -> torch.nn.Module:
        return build_model("simple-cnn", (1, 28, 28), 10, use_head=True, out_dim=16)

    algo = MoonClient(MoonOptions(mu=1.0, temperature=0.5), train_args(epochs=1, batch_size=4), factory, 0)
    received = {"model": {k: v.to(meta) for k, v in factory().state_dict().items()}}
    batch = (torch.empty(4, 1, 28, 28, device=meta), torch.zeros(4, dtype=torch.long, device=meta))
    names = tuple(n for n, p in factory().named_parameters() if p.requires_grad)
    jobs = [PartyJob(PartyRound(received, {}, 0, p, names), [batch] * (p + 1)) for p in range(3)]
    for job in jobs:
        prepare(algo, job, meta)
    for group in groups(jobs):
        train_group(algo, factory(), group, meta)
    for job in jobs:
        assert job.steps == job.party + 1
        assert {t.device for t in [*job.ctx.start.values(), *job.final.values()]} == {meta}


def test_batched_equals_sequential_through_the_core_loop_on_the_cpu() -> None:
    _check("moon", torch.device("cpu"))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "masked-step"])
def test_the_stacked_augmentation_trains_as_each_partys_own_on_the_cpu(graphs: bool) -> None:
    """Crop, flip and rotation made once for the step's stacked batches, from each party's own draws:
    the batched run (eager, and through the masked step) ends within 1e-4 of the sequential one."""
    _check("moon", torch.device("cpu"), graphs=graphs, augment="cifar100")


@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_the_stacked_augmentation_trains_as_each_partys_own_on_cuda(graphs: bool, no_tf32) -> None:
    _check("moon", torch.device("cuda"), graphs=graphs, augment="cifar100")


@pytest.mark.parametrize("algorithm", BUILT_IN)  # with no extra code; SCAFFOLD: its hooks inside the mask
def test_the_masked_step_that_cuda_graphs_replay_gives_the_sequential_result_on_the_cpu(algorithm) -> None:
    """Full batches through `MaskedStep` (all rows compute, finished parties are restored), the
    partial last batches through the eager step: the arithmetic a CUDA graph replays, run directly."""
    _check(algorithm, torch.device("cpu"), graphs=True)


@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_batched_equals_sequential_on_cuda(algorithm: str, graphs: bool, no_tf32) -> None:
    _check(algorithm, torch.device("cuda"), graphs)


@contextlib.contextmanager
def _tf32(on: bool) -> Iterator[None]:
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_ONLY)])
def test_with_tf32_batching_adds_no_error_beyond_tf32_rounding(device: str) -> None:
    """TF32 (PyTorch's default for cuDNN convolutions on Ampere and later) rounds the sequential and
    the batched (grouped) convolutions differently, so no fixed tolerance fits every GPU. The stated
    tolerance is relative to TF32's own error: after two MOON rounds, the largest distance of any
    model or party-state entry between batched-with-TF32 and the float32 sequential run is at most
    1e-4 + 2 x the largest distance between sequential-with-TF32 and that run. On a CPU TF32 changes
    nothing and this is the 1e-4 check of the plumbing."""
    dev = torch.device(device)
    with _tf32(False):
        exact = _round_trip("moon", dev, parallel=False)
    with _tf32(True):
        seq = _round_trip("moon", dev, parallel=False)
        bat = _round_trip("moon", dev, parallel=True)
    tf32_error = max(_distances(exact, seq).values())
    batched_error = max(_distances(exact, bat).values())
    assert batched_error <= 1e-4 + 2 * tf32_error, (batched_error, tf32_error)


def _synchronising_calls(epochs: int, graphs: bool, together: str = "stacked") -> int:
    """CUDA's synchronising calls (sync debug mode "warn") in one MOON round of 4 resident parties."""
    import warnings

    from fedml_moon.algorithms.moon import MoonClient, MoonOptions
    from tests.support.tiny import train_args

    device, data = torch.device("cuda"), _data("cifar10")
    parts = dirichlet_partition(data.y_train.numpy(), 4, 0.5, seed=0)
    loaders = build_fedml_dataset(data, parts, None, 32, 0, True, device=device, resident=True)

    def factory() -> torch.nn.Module:
        return build_model("simple-cnn", (1, 28, 28), 10, use_head=True, out_dim=16)

    train = train_args(
        epochs=epochs, batch_size=32, parties_in_parallel=4, cuda_graphs=graphs, together=together
    )
    algo = MoonClient(MoonOptions(mu=1.0), train, factory, 0)
    start = {k: v.to(device) for k, v in factory().state_dict().items()}
    names = tuple(n for n, p in factory().named_parameters() if p.requires_grad)
    jobs = [
        PartyJob(PartyRound({"model": start}, {}, 0, p, names), loaders.train_data_local_dict[p])
        for p in range(4)
    ]
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_parties(algo, factory().to(device), jobs, device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_the_step_loop_never_waits_for_the_gpu(graphs: bool) -> None:
    """Three times the epochs make at most one more synchronising call per party and extra epoch (an
    epoch's draw of its order may wait), and none per step: each party has about 5 steps an epoch,
    so a wait per step would add at least 10. What the host waits for otherwise comes once per round
    (contexts, grouping, the graph's capture, reading the loss sums), so the host runs ahead."""
    assert _synchronising_calls(3, graphs) - _synchronising_calls(1, graphs) <= 2 * 4
