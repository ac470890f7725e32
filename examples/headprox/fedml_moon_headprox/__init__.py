"""FedAvg with a proximal term on the head only: an algorithm that lives outside fedml_moon.

Local loss: CE + mu/2 * ||theta_head - theta_head^t||^2 over the projection head and the classifier
(FedProx's term, Li et al. 2020, Eq. 2, restricted to the layers above the encoder). What a party
sends, keeps and what the server does: FedAvg's. Installing this package registers it under the name
`fedprox_head` through the entry point group `fedml_moon.algorithms` (see pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import ClientAlgorithm, Context, Net, PartyRound, ServerAlgorithm
from fedml_moon.config.schema import require
from fedml_moon.losses import proximal_term
from fedml_moon.registry import AlgorithmSpec

HEAD = ("head.", "classifier.")


@dataclass
class HeadProxOptions:
    mu: float = 0.1
    """Weight of the proximal term mu/2 ||theta_head - theta_head^t||^2; 0 gives FedAvg (>= 0)."""

    def check(self) -> None:
        require(self.mu >= 0, "algorithm_args.mu", "the proximal weight must be >= 0")


class HeadProxClient(ClientAlgorithm):
    name = "fedprox_head"
    terms = ("ce", "prox")

    def context(self, r: PartyRound) -> Context:
        """The anchor: the server's head and classifier parameters, the same for every party."""
        anchor = {n: r.received["model"][n] for n in r.trainable if n.startswith(HEAD)}
        return Context(r.received["model"], self.train_args.learning_rate, {"anchor": anchor})

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        anchor = ctx["anchor"]
        ce = F.cross_entropy(net(x).logits, y)
        prox = proximal_term([net.params[n] for n in anchor], list(anchor.values()), self.options.mu)
        return ce + prox, {"ce": ce.detach(), "prox": prox.detach()}


def spec() -> AlgorithmSpec:
    """The entry point's object: what `fedml_moon.registry.load_plugins` registers."""
    return AlgorithmSpec(
        "fedprox_head", HeadProxClient, ServerAlgorithm, HeadProxOptions, "FedProx on the head only"
    )
