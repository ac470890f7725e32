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
from torch import nn

from fedml_moon.algorithms.base import ClientAlgorithm, Payload, ServerAlgorithm
from fedml_moon.config_schema import require
from fedml_moon.losses import proximal_term
from fedml_moon.registry import AlgorithmSpec

HEAD = ("head.", "classifier.")


@dataclass
class HeadProxOptions:
    mu: float = 0.1

    def check(self) -> None:
        require(self.mu >= 0, "algorithm_args.mu", "the proximal weight must be >= 0")


def head_parameters(model: nn.Module) -> list[torch.Tensor]:
    """The trainable parameters of the projection head and the classifier, in model order."""
    return [p for n, p in model.named_parameters() if n.startswith(HEAD) and p.requires_grad]


class HeadProxClient(ClientAlgorithm):
    name = "fedprox_head"

    def start_round(
        self, model: nn.Module, received: Payload, state: dict, round_idx: int, party_id: int
    ) -> None:
        super().start_round(model, received, state, round_idx, party_id)
        self._anchor = [p.detach().clone() for p in head_parameters(model)]

    def batch_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        ce = F.cross_entropy(model(x).logits, y)
        prox = proximal_term(head_parameters(model), self._anchor, self.options.mu)
        return ce + prox, {"ce": ce.detach(), "prox": prox.detach()}


def spec() -> AlgorithmSpec:
    """The entry point's object: what `fedml_moon.registry.load_plugins` registers."""
    return AlgorithmSpec(
        "fedprox_head", HeadProxClient, ServerAlgorithm, HeadProxOptions, "FedProx on the head only"
    )
