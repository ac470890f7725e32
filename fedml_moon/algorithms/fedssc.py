"""FedSSC: MOON plus a supervised contrastive loss against server-shared class prototypes.

Local loss CE + mu_moon * l_moon + mu_glob(t) * l_glob (FedSSC paper, Eq. 5). After local training
the party sends, besides its model, the mean projection of each class it holds more than
`min_class_samples` samples of, computed with its final local model (Eq. 4, Algorithm 1). The server
builds each class prototype from k randomly chosen parties that shared it (Section "Main
Differences"), or averages all of them (Algorithm 1's plain average), and sends the prototypes back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from fedml_moon.algorithms.base import Context, LocalResult, Net, PartyRound, Payload, ServerAlgorithm
from fedml_moon.algorithms.moon import MoonClient, MoonOptions
from fedml_moon.config.fields import choice
from fedml_moon.config.schema import require
from fedml_moon.core.losses import prototype_contrastive_loss
from fedml_moon.core.robust import RobustMean
from fedml_moon.core.seeds import rng
from fedml_moon.privacy.sums import SUM, UPDATE, Sums

PROTOTYPE_MODES = ("random-k", "mean")


@dataclass
class FedSSCOptions(MoonOptions):
    mu_glob_start: float = 1.0
    """mu_glob, the weight of the prototype term l_glob, for the first warmup_rounds rounds; >= 0"""
    mu_glob_end: float = 1e-4
    """mu_glob of the last round, reached in equal steps after warmup_rounds; >= 0"""
    warmup_rounds: int = 5
    """T0, the rounds at mu_glob_start before mu_glob falls; >= 0"""
    prototype_mode: str = choice("random-k", PROTOTYPE_MODES)
    """per class: random-k (average prototype_k random sharers' prototypes) or mean (every sharer's)"""
    prototype_k: int = 1
    """k, the parties random-k averages per class (all of them if fewer share it); >= 1"""
    min_class_samples: int = 10
    """a party shares a class prototype only when it holds more than this many samples of it; >= 0"""
    prototype_min_holders: int | str = "auto"
    """a class fewer parties share keeps its prototype: auto (3 under a robust rule, else 1) or >= 1"""

    def check(self) -> None:
        super().check()
        require(self.mu_glob_start >= 0, "algorithm_args.mu_glob_start", "must be >= 0 (the paper uses 1)")
        require(self.mu_glob_end >= 0, "algorithm_args.mu_glob_end", "must be >= 0 (the paper uses 1e-4)")
        require(self.warmup_rounds >= 0, "algorithm_args.warmup_rounds", "T0 must be >= 0 (the paper uses 5)")
        require(
            self.prototype_mode in PROTOTYPE_MODES,
            "algorithm_args.prototype_mode",
            f"choose one of {', '.join(PROTOTYPE_MODES)}",
        )
        require(self.prototype_k >= 1, "algorithm_args.prototype_k", "must be >= 1")
        require(self.min_class_samples >= 0, "algorithm_args.min_class_samples", "must be >= 0")
        holders = self.prototype_min_holders
        require(
            holders == "auto" or (type(holders) is int and holders >= 1),
            "algorithm_args.prototype_min_holders",
            f"'auto' (3 under a robust rule, else 1) or an integer >= 1; got {holders!r}",
        )


def mu_glob_at(round_idx: int, total_rounds: int, opts: FedSSCOptions) -> float:
    """mu_glob for 0-based `round_idx` of T = `total_rounds` (FedSSC Sec. IV).

    The first T0 = `warmup_rounds` rounds use mu_glob_start; every later round lowers it by
    (mu_glob_start - mu_glob_end) / (T - T0), the paper's per-round step, so the last round
    (T - 1) uses exactly mu_glob_end. With T0 >= T every round uses mu_glob_start.
    """
    t0, start, end = opts.warmup_rounds, opts.mu_glob_start, opts.mu_glob_end
    if round_idx < t0 or total_rounds <= t0:
        return start
    steps = min(round_idx + 1 - t0, total_rounds - t0)
    if steps == total_rounds - t0:
        return end  # exact, whatever the float rounding of the steps
    return start - steps * (start - end) / (total_rounds - t0)


@torch.no_grad()
def class_prototypes(
    model: nn.Module, loader: Iterable, num_classes: int, min_samples: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean projection z per class over `loader` ([C, D]) and a mask [C] of classes with > min_samples."""
    was_training = model.training
    model.eval()
    sums: torch.Tensor | None = None
    counts = torch.zeros(num_classes, dtype=torch.long)
    for x, y in loader:
        z = model(x).z.detach().cpu().to(torch.get_default_dtype())  # the model's (fp64: float64)
        if sums is None:
            sums = torch.zeros(num_classes, z.shape[1])
        sums.index_add_(0, y.cpu(), z)
        counts += torch.bincount(y.cpu(), minlength=num_classes)[:num_classes]
    model.train(was_training)
    if sums is None:
        raise ValueError("the party has no data to compute prototypes from")
    keep = counts > min_samples
    protos = torch.where(keep.unsqueeze(1), sums / counts.clamp(min=1).unsqueeze(1), torch.zeros_like(sums))
    return protos, keep


class FedSSCClient(MoonClient):
    """MOON's party side plus l_glob against the server's prototypes; uploads its own prototypes."""

    name = "fedssc"
    terms = ("ce", "l_con", "l_glob")

    def context(self, r: PartyRound) -> Context:
        """MOON's context, and (shared) the server's prototypes [C, D] with their mask [C] (None
        before the first aggregation) and mu_glob of the round."""
        ctx = super().context(r)
        mu_glob = mu_glob_at(r.round_idx, self.train_args.comm_round, self.options)
        protos, present = r.received.get("prototypes"), r.received.get("present")
        ctx.shared.update(protos=protos, present=present, mu_glob=mu_glob)
        return ctx

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        """MOON's loss + mu_glob * l_glob (FedSSC Eq. 5)."""
        loss, terms, z = self.moon_terms(net, x, y, ctx)
        if ctx["protos"] is None:
            l_glob = loss.new_zeros(())
        else:
            t = self.options.temperature
            l_glob = prototype_contrastive_loss(z, y, ctx["protos"], ctx["present"], t)
        terms["l_glob"] = l_glob.detach()
        return loss + ctx["mu_glob"] * l_glob, terms

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """MOON's, and the class prototypes of the final model over the party's data (Eq. 4)."""
        payload = super().finish(r, ctx, done)
        payload["prototypes"], payload["present"] = class_prototypes(
            done.model, done.batches(), done.num_classes, self.options.min_class_samples
        )
        return payload


def build_prototypes(
    uploads: list[tuple[torch.Tensor, torch.Tensor]],
    mode: str,
    k: int,
    rng: np.random.Generator,
    mean: RobustMean | None = None,
    previous: tuple[torch.Tensor, torch.Tensor] | None = None,
    min_holders: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class: mean of the prototypes of k random parties that sent it (all if fewer), or of all.

    `mean`: the server's upload average (`server_args.robust_aggregation`; None: the plain mean), given
    the class's previous prototype (from `previous`, prototypes and mask) where there is one. A class
    that fewer than `min_holders` parties sent keeps its previous prototype (absent if it had none)."""
    protos = torch.stack([p for p, _ in uploads])  # [P, C, D]
    present = torch.stack([m for _, m in uploads])  # [P, C]
    average = mean.rows if mean is not None else (lambda x, _: x.mean(dim=0))
    out, mask = keep_previous(previous, protos.shape[1:])
    for c in range(protos.shape[1]):
        parties = torch.nonzero(present[:, c]).flatten().tolist()
        if not parties or len(parties) < min_holders:
            continue
        if mode == "random-k" and len(parties) > k:
            parties = sorted(rng.choice(parties, size=k, replace=False).tolist())
        before = out[c] if bool(mask[c]) else None
        out[c], mask[c] = average(protos[parties, c], before), True
    return out, mask


def keep_previous(
    previous: tuple[torch.Tensor, torch.Tensor] | None, shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the previous prototypes [C, D] and mask [C], or zeros and an empty mask."""
    if previous is None:
        return torch.zeros(shape), torch.zeros(shape[0], dtype=torch.bool)
    dtype = torch.get_default_dtype()
    return previous[0].detach().clone().to(dtype), previous[1].detach().clone().bool()


class FedSSCServer(ServerAlgorithm):
    """FedAvg for the model; class prototypes from the parties' uploads (none before the first round)."""

    summed: ClassVar[dict[str, str]] = {"model": UPDATE, "prototypes": SUM, "present": SUM}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prototypes: torch.Tensor | None = None
        self.present: torch.Tensor | None = None
        self.rng = rng(self.seed, "prototypes")

    def download(self, global_state: OrderedDict, party_id: int | None = None) -> Payload:
        payload = super().download(global_state, party_id)
        if self.prototypes is not None:
            payload["prototypes"], payload["present"] = self.prototypes, self.present
        return payload

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """The model, a prototype per class [C, D] (the model's float dtype) and which classes it holds
        [C] (bool)."""
        spec = super().upload_spec(global_state, party_id)
        classes, dim = global_state["classifier.weight"].shape
        spec["prototypes"] = torch.empty(classes, dim, device="meta")
        spec["present"] = torch.empty(classes, dtype=torch.bool, device="meta")
        return spec

    def state(self) -> dict:
        extra = {"prototypes": self.prototypes, "present": self.present, "rng": self.rng.bit_generator.state}
        return {**super().state(), **extra}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.prototypes, self.present = state["prototypes"], state["present"]
        self.rng.bit_generator.state = dict(state["rng"])

    def upload_problem(self, upload: Payload, party_id: int) -> str | None:
        """A party may share the prototype of a class only if it holds more than `min_class_samples`
        samples of it, by the partition the server holds or the party's claim (`held`): its `present`
        must be exactly that (an honest party's is), so no party speaks for a class it did not claim."""
        held = self.held(int(party_id), upload["present"].numel())
        if held is None:
            return None
        claimed = upload["present"].detach().cpu().bool()
        if torch.equal(claimed, held):
            return None
        wrong = torch.nonzero(claimed != held).flatten().tolist()
        return (
            f"upload.present differs at classes {wrong[:10]}: party {party_id} holds more than "
            f"{self.options.min_class_samples} samples of classes {torch.nonzero(held).flatten().tolist()} "
            "(a party shares the prototypes of its own classes only)"
        )

    def held(self, party: int, num_classes: int) -> torch.Tensor | None:
        """The classes `party` may share (bool [C]): those it claims (`classes_held`: its claim, or
        the server's partition), else those it holds more than min_class_samples of by `class_counts`."""
        if party in self.classes_held:
            mask = torch.zeros(num_classes, dtype=torch.bool)
            mask[self.classes_held[party]] = True
            return mask
        counts = self.class_counts.get(party)
        return None if counts is None else torch.tensor(counts) > self.options.min_class_samples

    def min_holders(self) -> int:
        """`prototype_min_holders`: auto is 3 under a robust rule (which needs 3 values to act), else 1."""
        holders = self.options.prototype_min_holders
        if holders == "auto":
            return 3 if self.mean.rule != "none" else 1
        return int(holders)

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        """Prototypes from the round's sums: per class, the sum of the prototypes of the parties that
        hold it over their count (`prototype_mode: mean`), for classes that at least `min_holders`
        parties hold (the others keep their previous prototype); then the model as every algorithm."""
        counts = sums.fields["present"]
        fresh = counts > max(0.5, self.min_holders() - 0.5)
        protos = sums.fields["prototypes"] / counts.clamp(min=1.0).unsqueeze(1)
        previous = None if self.prototypes is None else (self.prototypes, self.present)
        before, mask = keep_previous(previous, protos.shape)
        self.prototypes = torch.where(fresh.unsqueeze(1), protos.to(before.dtype), before)
        self.present = fresh | mask
        return super().aggregate_sums(global_state, sums)

    def aggregate(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        pairs = [(p["prototypes"], p["present"]) for _, p in uploads]
        opts = self.options
        previous = None if self.prototypes is None else (self.prototypes, self.present)
        self.prototypes, self.present = build_prototypes(
            pairs, opts.prototype_mode, opts.prototype_k, self.rng, self.mean, previous, self.min_holders()
        )
        return super().aggregate(global_state, uploads)
