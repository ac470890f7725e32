"""What the contributor tutorial says of operations under stacked parties, checked against the
installed PyTorch as the engine stacks them (`core.batched.vmapped` of the forward, then backward):
the ops it names as falling back warn of a missing batching rule, those it names as batched do not,
and `F.gaussian_nll_loss` cannot run stacked. Also the algorithms' own generators."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import NoOptions, PartyRound, ServerAlgorithm
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.config.schema import ServerArgs
from fedml_moon.core.batched import vmapped
from tests.support.tiny import tiny_factory, train_args

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorials" / "write-algorithm.md"
K, B, C = 3, 4, 5


def _soft(a: torch.Tensor) -> torch.Tensor:
    return F.softmax(a.detach(), 1)


LOSSES = {  # name as the tutorial writes it -> one party's loss of its logits a [B, C] and labels t [B]
    "F.kl_div": lambda a, t: F.kl_div(F.log_softmax(a, 1), _soft(a), reduction="batchmean"),
    "F.multi_margin_loss": lambda a, t: F.multi_margin_loss(a, t),
    "F.multilabel_margin_loss": lambda a, t: F.multilabel_margin_loss(
        a, torch.zeros_like(t)[:, None].expand(-1, C)
    ),
    "F.soft_margin_loss": lambda a, t: F.soft_margin_loss(a, torch.ones_like(a)),
    "F.triplet_margin_loss": lambda a, t: F.triplet_margin_loss(a, a.detach(), a.detach().flip(0)),
    "F.margin_ranking_loss": lambda a, t: F.margin_ranking_loss(a[:, 0], a[:, 1], torch.ones(B)),
    "F.gaussian_nll_loss": lambda a, t: F.gaussian_nll_loss(a, a.detach(), torch.ones_like(a)),
    "F.cross_entropy": lambda a, t: F.cross_entropy(a, t) + F.cross_entropy(a, _soft(a), label_smoothing=0.1),
    "F.nll_loss": lambda a, t: F.nll_loss(F.log_softmax(a, 1), t),
    "F.mse_loss": lambda a, t: F.mse_loss(a, a.detach() / 2),
    "F.l1_loss": lambda a, t: F.l1_loss(a, a.detach() / 2),
    "F.smooth_l1_loss": lambda a, t: F.smooth_l1_loss(a, a.detach() / 2),
    "F.huber_loss": lambda a, t: F.huber_loss(a, a.detach() / 2),
    "F.binary_cross_entropy(_with_logits)": lambda a, t: (
        F.binary_cross_entropy(torch.sigmoid(a), _soft(a)) + F.binary_cross_entropy_with_logits(a, _soft(a))
    ),
    "F.poisson_nll_loss": lambda a, t: F.poisson_nll_loss(a, a.detach().abs()),
    "F.hinge_embedding_loss": lambda a, t: F.hinge_embedding_loss(a, torch.ones_like(a)),
    "F.cosine_similarity": lambda a, t: F.cosine_similarity(a, a.detach().flip(0), dim=1).sum(),
    "F.normalize": lambda a, t: F.normalize(a, dim=1).sum(),
    "torch.cdist": lambda a, t: torch.cdist(a, a.detach()).sum(),
    "torch.logsumexp": lambda a, t: torch.logsumexp(a, 1).sum(),
    "F.log_softmax": lambda a, t: F.log_softmax(a, 1).sum(),
    "torch.gather": lambda a, t: a.gather(1, t[:, None]).sum(),
    "KL written out": lambda a, t: (_soft(a) * (_soft(a).log() - F.log_softmax(a, 1))).sum(1).mean(),
}


def _stacked(loss) -> str:
    """'batched', 'fallback' or 'error': K parties' loss stacked as the engine stacks them."""
    weights, x = torch.randn(K, C, C, requires_grad=True), torch.randn(K, B, C)
    labels = torch.randint(0, C, (K, B))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            vmapped(lambda w, xx, t: loss(xx @ w, t), (0, 0, 0))(weights, x, labels).sum().backward()
        except RuntimeError:
            return "error"
    return "fallback" if any("batching rule" in str(w.message) for w in caught) else "batched"


def _named(paragraph: str) -> list[str]:
    return re.findall(r"`((?:F|torch)\.[\w.()]+)`", paragraph)


def test_the_tutorials_lists_of_stacked_operations_hold():
    text = " ".join(TUTORIAL.read_text().split())
    start = text.index("then backward) these fall back:")
    falls, rest = text[start:].split("cannot run stacked at all", 1)
    batched = rest.split("are batched", 1)[0]
    fallback_names, batched_names = _named(falls), _named(batched)
    assert fallback_names[-1] == "F.gaussian_nll_loss" and len(fallback_names) == 7
    assert len(batched_names) >= 14
    for name in fallback_names[:-1]:
        assert _stacked(LOSSES[name]) == "fallback", name
    assert _stacked(LOSSES["F.gaussian_nll_loss"]) == "error"
    for name in batched_names:
        assert _stacked(LOSSES[name]) == "batched", name
    assert _stacked(LOSSES["KL written out"]) == "batched"


def test_an_algorithms_generator_depends_on_run_round_and_party_only():
    client = FedAvgClient(NoOptions(), train_args(), tiny_factory(), 7)

    def draw(round_idx: int, party: int, seed: int = 7) -> torch.Tensor:
        algo = client if seed == 7 else FedAvgClient(NoOptions(), train_args(), tiny_factory(), seed)
        return torch.randn(5, generator=algo.generator(PartyRound({}, {}, round_idx, party, ())))

    first = draw(3, 1)
    torch.manual_seed(123), torch.randn(100)  # the global state moves: the party's draws do not
    assert torch.equal(draw(3, 1), first)
    assert not any(torch.equal(first, other) for other in (draw(3, 2), draw(4, 1), draw(3, 1, seed=8)))
    server = ServerAlgorithm(NoOptions(), ServerArgs(), train_args(), seed=7)
    ours = torch.randn(5, generator=server.generator(3))
    assert torch.equal(ours, torch.randn(5, generator=server.generator(3)))
    assert not torch.equal(ours, torch.randn(5, generator=server.generator(4))) and not torch.equal(
        ours, first
    )


@pytest.mark.parametrize("name", ["F.kl_div"])
def test_a_fallback_still_gives_each_party_its_own_gradient(name):
    """A fallback is a loop, not an error: the stacked gradients equal each party's alone."""
    weights, x = torch.randn(K, C, C, requires_grad=True), torch.randn(K, B, C)
    labels = torch.randint(0, C, (K, B))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vmapped(lambda w, xx, t: LOSSES[name](xx @ w, t), (0, 0, 0))(weights, x, labels).sum().backward()
    for k in range(K):
        w = weights[k].detach().clone().requires_grad_(True)
        LOSSES[name](x[k] @ w, labels[k]).backward()
        assert torch.allclose(weights.grad[k], w.grad, atol=1e-6)
