"""FedSSC: the prototype loss by hand, prototypes over the threshold only, the server's averaging."""

import math

import numpy as np
import pytest
import torch

from fedml_moon.algorithms.fedssc import (
    FedSSCClient,
    FedSSCOptions,
    FedSSCServer,
    build_prototypes,
    class_prototypes,
    mu_glob_at,
)
from fedml_moon.config.schema import ServerArgs
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.models import ModelOutput
from fedml_moon.engine.batched import train_party
from fedml_moon.losses import prototype_contrastive_loss
from tests.support.tiny import tiny_batches, tiny_factory, train_args

E = torch.eye(3)


def test_prototype_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [7.0, 7.0]])
    present = torch.tensor([True, True, False])
    labels = torch.tensor([0, 2])  # the second sample's class has no prototype
    expected = math.log(1 + math.exp(-1 / 0.5)) / 2  # one sample contributes, mean over B = 2
    assert prototype_contrastive_loss(z, labels, protos, present, 0.5).item() == pytest.approx(
        expected, rel=1e-6
    )


def test_prototype_loss_equal_similarities_give_log_of_present_classes():
    z = torch.tensor([[1.0, 1.0, 1.0]])
    protos = torch.cat([E, torch.ones(1, 3)])  # sim(z, e_k) equal for k = 0..2
    present = torch.tensor([True, True, True, False])
    loss = prototype_contrastive_loss(z, torch.tensor([1]), protos, present, 0.3)
    assert loss.item() == pytest.approx(math.log(3), abs=1e-6)


def test_prototype_loss_without_prototypes_is_zero_and_gradient_reaches_z_only():
    z = torch.randn(4, 3, requires_grad=True)
    none = prototype_contrastive_loss(
        z, torch.zeros(4, dtype=torch.long), E, torch.zeros(3, dtype=torch.bool), 0.5
    )
    assert none.item() == 0.0
    protos = torch.randn(3, 3, requires_grad=True)
    prototype_contrastive_loss(
        z, torch.tensor([0, 1, 2, 0]), protos.detach(), torch.ones(3, dtype=torch.bool), 0.5
    ).backward()
    assert z.grad is not None and protos.grad is None


def test_prototypes_only_for_classes_over_the_threshold():
    class Identity(torch.nn.Module):
        def forward(self, x):
            return ModelOutput(x, x, x)

    x = torch.cat([torch.full((11, 2), 1.0), torch.full((10, 2), 3.0), torch.full((12, 2), 5.0)])
    y = torch.tensor([0] * 11 + [1] * 10 + [2] * 12)
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, len(y), 8)]
    protos, present = class_prototypes(Identity(), batches, num_classes=4, min_samples=10)
    assert present.tolist() == [True, False, True, False]  # "more than 10": 10 is not enough
    assert torch.equal(protos[0], torch.tensor([1.0, 1.0])) and torch.equal(
        protos[2], torch.tensor([5.0, 5.0])
    )
    assert torch.equal(protos[1], torch.zeros(2))


def test_server_mean_and_random_k_by_hand():
    p = [torch.tensor([[1.0], [10.0]]), torch.tensor([[3.0], [0.0]]), torch.tensor([[5.0], [0.0]])]
    m = [torch.tensor([True, True]), torch.tensor([True, False]), torch.tensor([True, False])]
    protos, present = build_prototypes(list(zip(p, m, strict=True)), "mean", 1, np.random.default_rng(0))
    assert protos[:, 0].tolist() == [3.0, 10.0] and present.tolist() == [True, True]
    rng = np.random.default_rng(0)
    seen = {
        build_prototypes(list(zip(p, m, strict=True)), "random-k", 1, rng)[0][0, 0].item() for _ in range(30)
    }
    assert seen == {1.0, 3.0, 5.0}  # one random party per class
    two = build_prototypes(list(zip(p, m, strict=True)), "random-k", 2, rng)[0]
    assert two[0, 0].item() in {2.0, 3.0, 4.0} and two[1, 0].item() == 10.0  # fewer than k: all of them


def test_class_without_prototype_is_absent():
    p = [torch.zeros(3, 2), torch.ones(3, 2)]
    m = [torch.tensor([True, False, False]), torch.tensor([True, True, False])]
    _, present = build_prototypes(list(zip(p, m, strict=True)), "mean", 1, np.random.default_rng(0))
    assert present.tolist() == [True, True, False]


def test_mu_glob_warmup_and_linear_decay():
    """T = 15 rounds (0..14), T0 = 5: rounds 0-4 at the start value, then 10 equal steps of 0.1."""
    opts = FedSSCOptions(mu_glob_start=1.0, mu_glob_end=0.0, warmup_rounds=5)
    values = [mu_glob_at(r, 15, opts) for r in range(15)]
    assert values[:5] == [1.0] * 5
    assert values[5:] == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0], abs=1e-12)


def test_mu_glob_paper_schedule_ends_at_the_end_value():
    """The paper's setting: start 1, end 1e-4, T = 100, T0 = 5; the last round (99) uses exactly 1e-4."""
    opts = FedSSCOptions()  # mu_glob_start 1, mu_glob_end 1e-4, warmup_rounds 5
    assert mu_glob_at(0, 100, opts) == 1.0
    assert mu_glob_at(4, 100, opts) == 1.0  # the last warm-up round
    assert mu_glob_at(5, 100, opts) == pytest.approx(1.0 - 0.9999 / 95)  # one step down
    assert mu_glob_at(99, 100, opts) == 1e-4
    assert mu_glob_at(3, 3, opts) == 1.0  # T0 >= T: no decay at all


def test_mu_glob_single_decay_round_is_the_end_value():
    opts = FedSSCOptions(mu_glob_start=2.0, mu_glob_end=0.5, warmup_rounds=2)
    assert [mu_glob_at(r, 3, opts) for r in range(3)] == [2.0, 2.0, 0.5]


def test_round_trip_sends_prototypes_and_round_zero_has_none():
    opts = FedSSCOptions(mu=1.0, min_class_samples=0)
    client = FedSSCClient(opts, train_args(), tiny_factory(), seed=0)
    server = FedSSCServer(opts, ServerArgs(), train_args())
    model = tiny_factory()()
    start = clone_state(model.state_dict())
    down = server.download(start)
    assert "prototypes" not in down
    metrics, up = train_party(client, model, down, {}, tiny_batches(), torch.device("cpu"), 0, 0)
    assert metrics["l_glob"] == 0.0
    assert up["prototypes"].shape == (3, 8) and up["present"].dtype == torch.bool
    server.aggregate(start, [(24.0, up)])
    down = server.download(server_state := start)
    assert torch.equal(down["prototypes"], up["prototypes"]) and server_state is start
    metrics, _ = train_party(
        client, tiny_factory()(), down, {"pool": [start]}, tiny_batches(), torch.device("cpu"), 1, 0
    )
    assert metrics["l_glob"] > 0.0
