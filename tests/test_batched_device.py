"""Batched parties on the run's device: two rounds of every built-in algorithm driven through the pure
core (server half, party half, loaders built for the device with the data set resident there), batched
against one-after-another, within 1e-4. CUDA cases run where a GPU is; the CPU case keeps the plumbing of
this loop (resident loaders, device moves) tested everywhere. Nothing here imports FedML, so these tests
also run on machines that have a GPU but no FedML."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from fedml_moon.algorithms.base import PartyRound
from fedml_moon.core.models import build_model
from fedml_moon.engine.batched import PartyJob
from tests.support.devices import BUILT_IN, CUDA, distances, round_trip, synchronising_calls
from tests.support.marks import CUDA_ONLY


def _check(algorithm: str, device: torch.device, graphs: bool = False, augment: str = "none") -> None:
    seq = round_trip(algorithm, device, parallel=False, augment=augment)
    bat = round_trip(algorithm, device, parallel=True, graphs=graphs, augment=augment)
    for key, diff in distances(seq, bat).items():
        assert diff <= 1e-4, (algorithm, key, diff)


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
        exact = round_trip("moon", dev, parallel=False)
    with _tf32(True):
        seq = round_trip("moon", dev, parallel=False)
        bat = round_trip("moon", dev, parallel=True)
    tf32_error = max(distances(exact, seq).values())
    batched_error = max(distances(exact, bat).values())
    assert batched_error <= 1e-4 + 2 * tf32_error, (batched_error, tf32_error)


@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_the_step_loop_never_waits_for_the_gpu(graphs: bool) -> None:
    """Three times the epochs make at most one more synchronising call per party and extra epoch (an
    epoch's draw of its order may wait), and none per step: each party has about 5 steps an epoch,
    so a wait per step would add at least 10. What the host waits for otherwise comes once per round
    (contexts, grouping, the graph's capture, reading the loss sums), so the host runs ahead."""
    assert synchronising_calls(3, graphs) - synchronising_calls(1, graphs) <= 2 * 4
