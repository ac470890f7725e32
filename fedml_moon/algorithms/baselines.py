"""The baselines the MOON paper compares against: FedAvg, FedProx and SOLO."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import (
    ClientAlgorithm,
    Context,
    LocalResult,
    Net,
    PartyRound,
    Payload,
    ServerAlgorithm,
)
from fedml_moon.config.schema import require
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.losses import proximal_term


class FedAvgClient(ClientAlgorithm):
    """FedAvg (McMahan et al. 2017): plain cross-entropy; sends the whole model."""

    name = "fedavg"


@dataclass
class FedProxOptions:
    mu: float = 0.01
    """weight mu of the proximal term mu/2 ||w - w^t||^2 over the trainable parameters; >= 0"""

    def check(self) -> None:
        require(
            self.mu >= 0, "algorithm_args.mu", "the proximal weight must be >= 0 (the paper tunes 0.001..1)"
        )


class FedProxClient(ClientAlgorithm):
    """FedProx (Li et al. 2020): CE + mu/2 ||w - w^t||^2 over the trainable parameters (Eq. 2)."""

    name = "fedprox"
    terms = ("ce", "prox")

    def context(self, r: PartyRound) -> Context:
        """The anchor w^t: the server's trainable parameters, the same for every party."""
        anchor = {n: r.received["model"][n] for n in r.trainable}
        return Context(r.received["model"], self.train_args.learning_rate, {"anchor": anchor})

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        anchor = ctx["anchor"]
        ce = F.cross_entropy(net(x).logits, y)
        prox = proximal_term([net.params[n] for n in anchor], list(anchor.values()), self.options.mu)
        return ce + prox, {"ce": ce.detach(), "prox": prox.detach()}


class SoloClient(ClientAlgorithm):
    """SOLO: each party trains its own model on its own data only; nothing is averaged.

    The party keeps its model between rounds; at its first round it starts from the model the server
    sent (the common initial model w^0). It sends its model only so the server can evaluate it.
    """

    name = "solo"

    def context(self, r: PartyRound) -> Context:
        """Starts from the party's own model (the server's w^0 before its first round)."""
        return Context(self.eval_state(r.received, r.state), self.train_args.learning_rate)

    def personal_state(self, state: dict) -> dict | None:
        """The party's own model (None before it first trains: it starts from the server's w^0)."""
        return state.get("model")

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """Keeps the trained model; sends it for evaluation."""
        r.state["model"] = clone_state(done.final)
        return super().finish(r, ctx, done)


class SoloServer(ServerAlgorithm):
    """Keeps each party's latest model; evaluation reports the mean and std over parties."""

    averages = False  # nothing is averaged: server_args.robust_aggregation does not apply
    summed: ClassVar[dict[str, str]] = {}  # nor does privacy_args: there is no sum

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.party_models: dict[int, OrderedDict] = {}

    def combine(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        """Store each party's model; the global state is left as it is (nothing is averaged)."""
        for _, payload in uploads:
            self.party_models[int(payload["party_id"])] = payload["model"]
        return global_state

    def state(self) -> dict:
        return {**super().state(), "party_models": dict(self.party_models)}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.party_models = {int(p): s for p, s in state["party_models"].items()}

    def models_to_evaluate(self, global_state: OrderedDict) -> dict[str, OrderedDict]:
        if not self.party_models:
            return {"global": global_state}
        return {f"party_{p}": s for p, s in sorted(self.party_models.items())}
