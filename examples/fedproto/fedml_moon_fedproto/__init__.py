"""fedproto: FedProto's prototype exchange (Tan et al., AAAI 2022) on top of FedAvg, as the tutorial
"Write an algorithm" builds it from `fedml-moon new fedproto`.

Each party adds to its cross-entropy lambda times the squared distance between each sample's
representation z and the global prototype of its class (the local objective's L_R, as the authors'
code computes it: MSE per sample), and uploads the mean representation of each class it holds
(a local prototype); the server averages them per class into the global prototypes it sends next
round. Unlike the paper, whose parties keep heterogeneous models, the model is averaged too (FedAvg).
"""

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
from fedml_moon.privacy.sums import SUM, UPDATE, Sums
from fedml_moon.registry import AlgorithmSpec

WEIGHTINGS = ("parties", "samples")


# --8<-- [start:options]
@dataclass
class FedprotoOptions:
    """The config's `algorithm_args`."""

    ld: float = 1.0
    """lambda, the weight of the prototype term; 0 gives FedAvg (the paper and its code use 1)"""
    weighting: str = "parties"
    """a class's global prototype: parties (the mean over the parties that hold it, the authors'
    code) or samples (weighted by each party's samples of the class, the paper's aggregation)"""

    def check(self) -> None:
        require(self.ld >= 0, "algorithm_args.ld", "lambda must be >= 0")
        require(self.weighting in WEIGHTINGS, "algorithm_args.weighting", f"one of {', '.join(WEIGHTINGS)}")


# --8<-- [end:options]


def prototype_loss(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, known: torch.Tensor
) -> torch.Tensor:
    """FedProto's L_R as the authors' code computes it: the mean squared difference between each
    sample's representation z [B, D] and the global prototype [C, D] of its class y [B]; samples of
    a class without a global prototype (`known` [C], bool) add 0."""
    gap = torch.where(known[y].unsqueeze(1), z - protos[y], torch.zeros_like(z))
    return (gap**2).mean()


@torch.no_grad()
def class_means(done: LocalResult) -> tuple[torch.Tensor, torch.Tensor]:
    """The final model's mean representation z of each class over the party's data [C, D] and the
    party's samples per class [C] (FedProto's local prototype C_i^(j))."""
    model, sums, counts = done.model, None, torch.zeros(done.num_classes)
    was_training = model.training
    model.eval()
    for x, y in done.batches():
        z = model(x).z.detach().cpu()
        sums = torch.zeros(done.num_classes, z.shape[1]) if sums is None else sums
        sums.index_add_(0, y.cpu(), z.to(sums.dtype))
        counts += torch.bincount(y.cpu(), minlength=done.num_classes).to(counts.dtype)
    model.train(was_training)
    return sums / counts.clamp(min=1).unsqueeze(1), counts


# --8<-- [start:client]
class FedprotoClient(ClientAlgorithm):
    """CE + lambda * L_R against the server's prototypes; uploads the model and its class means."""

    name = "fedproto"
    terms = ("ce", "proto")

    def context(self, r: PartyRound) -> Context:
        """The server's model, and (shared by every party) its prototypes and which classes have
        one; None before the first aggregation."""
        shared = {"protos": r.received.get("protos"), "known": r.received.get("known")}
        return Context(r.received["model"], self.train_args.learning_rate, shared=shared)

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        out = net(x)
        ce = F.cross_entropy(out.logits, y)
        if ctx["protos"] is None:  # the same for every party of a round: not a branch on data
            proto = ce.new_zeros(())
        else:
            proto = prototype_loss(out.z, y, ctx["protos"], ctx["known"])
        return ce + self.options.ld * proto, {"ce": ce.detach(), "proto": proto.detach()}

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """The model, and each class's mean representation times its weight (1 for a class the party
        holds under `parties`, its samples of it under `samples`) with the weights."""
        means, counts = class_means(done)
        weight = counts if self.options.weighting == "samples" else (counts > 0).to(counts.dtype)
        payload = {"model": clone_state(done.final), "party_id": int(r.party)}
        payload["proto_sum"], payload["proto_weight"] = means * weight.unsqueeze(1), weight
        return payload


# --8<-- [end:client]


# --8<-- [start:server]
class FedprotoServer(ServerAlgorithm):
    """FedAvg for the model; per class, the weighted mean of the parties' prototypes (a class no
    party sent this round keeps its previous global prototype)."""

    summed: ClassVar[dict[str, str]] = {"model": UPDATE, "proto_sum": SUM, "proto_weight": SUM}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.protos: torch.Tensor | None = None  # [C, D]
        self.known: torch.Tensor | None = None  # [C], bool

    def download(self, global_state: OrderedDict, party_id: int | None = None) -> Payload:
        payload = super().download(global_state, party_id)
        if self.protos is not None:
            payload["protos"], payload["known"] = self.protos, self.known
        return payload

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """The model, and a prototype sum [C, D] and weight [C] per class (the classifier reads z)."""
        spec = super().upload_spec(global_state, party_id)
        classes, dim = global_state["classifier.weight"].shape
        spec["proto_sum"] = torch.empty(classes, dim, device="meta")
        spec["proto_weight"] = torch.empty(classes, device="meta")
        return spec

    def update_protos(self, proto_sum: torch.Tensor, weight: torch.Tensor) -> None:
        """Global prototypes from the round's sums over its parties (the weighted mean per class)."""
        fresh = weight > 0
        mean = (proto_sum / weight.clamp(min=1e-12).unsqueeze(1)).to(torch.get_default_dtype())
        before = self.protos if self.protos is not None else torch.zeros_like(mean)
        self.protos = torch.where(fresh.unsqueeze(1), mean, before)
        self.known = fresh if self.known is None else fresh | self.known

    def aggregate(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        sums = torch.stack([p["proto_sum"].double() for _, p in uploads]).sum(dim=0)
        weights = torch.stack([p["proto_weight"].double() for _, p in uploads]).sum(dim=0)
        self.update_protos(sums, weights)
        return super().aggregate(global_state, uploads)

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        self.update_protos(sums.fields["proto_sum"], sums.fields["proto_weight"])
        return super().aggregate_sums(global_state, sums)

    def state(self) -> dict:
        return {**super().state(), "protos": self.protos, "known": self.known}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.protos, self.known = state["protos"], state["known"]


# --8<-- [end:server]


def spec() -> AlgorithmSpec:
    """The algorithm as the registry knows it (the package's entry point and `common_args.plugins`
    name this function)."""
    return AlgorithmSpec(
        "fedproto", FedprotoClient, FedprotoServer, FedprotoOptions, "FedProto's prototypes + FedAvg"
    )
