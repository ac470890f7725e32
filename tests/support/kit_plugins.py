"""Plugins for the contributor kit's tests, loaded as `common_args.plugins` (`tests.support.kit_plugins:NAME`)
by every process a check starts: the tutorial's FedProto broken the ways contributors break
algorithms (one refusing buffered aggregation with a reason of its own), a correct algorithm
whose loss is full of ReLU kinks, and one whose option declares its allowed values."""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch.nn.functional as F

from fedml_moon.algorithms.base import ClientAlgorithm, NoOptions, ServerAlgorithm
from fedml_moon.config.fields import choice
from fedml_moon.errors import require
from fedml_moon.privacy.sums import UPDATE, Sums
from fedml_moon.registry import AlgorithmSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fedproto"
if str(EXAMPLE) not in sys.path:
    sys.path.append(str(EXAMPLE))

from fedml_moon_fedproto import FedprotoClient, FedprotoOptions, FedprotoServer  # noqa: E402


class ForgetfulServer(FedprotoServer):
    """Keeps prototypes across rounds but checkpoints only what ServerAlgorithm does."""

    state = ServerAlgorithm.state
    load_state = ServerAlgorithm.load_state


class UnsummedServer(FedprotoServer):
    """Its sum form names the model only: under privacy_args the prototypes would be dropped."""

    summed = {"model": UPDATE}


class SumsIgnoredServer(FedprotoServer):
    """Names the prototypes in `summed`, but its aggregate_sums never reads them."""

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        return ServerAlgorithm.aggregate_sums(self, global_state, sums)


class RoundSizedServer(FedprotoServer):
    """Expects a round's sums to hold every party a round samples: true of a synchronous round that
    loses no party, not of a buffer smaller than a round."""

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        per_round = self.train_args.client_num_per_round
        if sums.count != per_round:
            raise ValueError(f"sums of {sums.count} parties; a round samples {per_round}")
        return super().aggregate_sums(global_state, sums)


class NotBufferedServer(FedprotoServer):
    """Says why it does not buffer."""

    not_buffered = "its prototypes are a round's class means, which a buffer of stale ones would blur"


class BranchyClient(FedprotoClient):
    """Doubles its prototype term when the batch's cross-entropy is high: a Python branch on data."""

    name = "proto_branchy"

    def loss(self, net, x, y, ctx):
        loss, terms = super().loss(net, x, y, ctx)
        return (loss * 2 if terms["ce"].item() > 1.0 else loss), terms


class HingeClient(ClientAlgorithm):
    """A correct algorithm with many kinks: the multi-class hinge loss (Crammer-Singer) on the
    logits plus a ReLU margin on the projection's norm."""

    name = "hinge_kinks"
    terms = ("hinge", "norm")

    def loss(self, net, x, y, ctx):
        out = net(x)
        true = out.logits.gather(1, y.unsqueeze(1))
        margins = F.relu(1.0 + out.logits - true).sum(dim=1) - 1.0
        hinge = margins.mean()
        norm = F.relu(out.z.norm(dim=1) - 1.0).mean()
        return hinge + 0.1 * norm, {"hinge": hinge.detach(), "norm": norm.detach()}


REDUCTIONS = ("mean", "sum")


@dataclass
class ReducedOptions:
    reduction: str = choice("mean", REDUCTIONS)
    """how a batch's cross-entropies make its loss: mean or sum"""

    def check(self) -> None:
        require(self.reduction in REDUCTIONS, "algorithm_args.reduction", f"one of {', '.join(REDUCTIONS)}")


class ReducedClient(ClientAlgorithm):
    """FedAvg whose batch loss is the mean or the sum of its cross-entropies (`reduction`)."""

    name = "ce_reduced"

    def loss(self, net, x, y, ctx):
        ce = F.cross_entropy(net(x).logits, y, reduction=self.options.reduction)
        return ce, {"ce": ce.detach()}


def _proto(name: str, client: type = FedprotoClient, server: type = FedprotoServer) -> AlgorithmSpec:
    return AlgorithmSpec(name, client, server, FedprotoOptions, f"FedProto ({name})")


def forgetful() -> AlgorithmSpec:
    return _proto("proto_forgetful", server=ForgetfulServer)


def unsummed() -> AlgorithmSpec:
    return _proto("proto_unsummed", server=UnsummedServer)


def sums_ignored() -> AlgorithmSpec:
    return _proto("proto_sums_ignored", server=SumsIgnoredServer)


def round_sized() -> AlgorithmSpec:
    return _proto("proto_round_sized", server=RoundSizedServer)


def not_buffered() -> AlgorithmSpec:
    return _proto("proto_not_buffered", server=NotBufferedServer)


def branchy() -> AlgorithmSpec:
    return _proto("proto_branchy", client=BranchyClient)


def hinge() -> AlgorithmSpec:
    return AlgorithmSpec("hinge_kinks", HingeClient, ServerAlgorithm, NoOptions, "hinge loss")


def reduced() -> AlgorithmSpec:
    return AlgorithmSpec("ce_reduced", ReducedClient, ServerAlgorithm, ReducedOptions, "FedAvg, CE reduced")


__all__ = [
    "branchy",
    "forgetful",
    "hinge",
    "not_buffered",
    "reduced",
    "round_sized",
    "sums_ignored",
    "unsummed",
]
