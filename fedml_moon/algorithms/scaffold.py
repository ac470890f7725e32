"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020), a MOON Table 1 baseline.

Control variates c (server) and c_i (party i) cover the model's trainable parameters only (by
state-dict name), never buffers; both start at zeros. Local steps follow Algorithm 1 line 10,
y_i <- y_i - eta_l (g_i(y_i) - c_i + c), and the party's control variate follows option II of
line 12. The server averages models (line 16) and updates c <- c + |S|/N * mean_S(delta c_i) (line 17).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedml_moon.algorithms.base import (
    ClientAlgorithm,
    Context,
    LocalResult,
    PartyRound,
    Payload,
    ServerAlgorithm,
    add_rows,
)
from fedml_moon.config.fields import choice
from fedml_moon.config.schema import require
from fedml_moon.privacy.sums import SUM, UPDATE, Sums

CORRECTION_CHOICES = ("after-step", "gradient")
C_UPDATE_CHOICES = ("paper", "mean")
Tensors = dict[str, torch.Tensor]


@dataclass
class ScaffoldOptions:
    """`correction`: "after-step" (NIID-Bench, the MOON authors' benchmark code that holds their
    SCAFFOLD baseline: p -= lr * (c - c_i) after each optimiser step) or "gradient" (the paper's
    line 10: grad += c - c_i before the step, so it passes through momentum and weight decay).
    `c_update`: "paper" (line 17 and NIID-Bench: c += |S|/N * mean_S delta c_i, i.e. the sum over
    the sampled parties divided by N) or "mean" (c += mean_S delta c_i, as some other libraries
    do; the same under full participation). The global step size eta_g (line 16) is
    `server_args.server_lr`."""

    correction: str = choice("after-step", CORRECTION_CHOICES)
    """after-step: p -= lr (c - c_i) after each step (NIID-Bench); gradient: c - c_i added to the gradient"""
    c_update: str = choice("paper", C_UPDATE_CHOICES)
    """the server's c: paper (c += |S|/N mean of delta c_i) or mean (c += mean of delta c_i)"""

    def check(self) -> None:
        require(
            self.correction in CORRECTION_CHOICES,
            "algorithm_args.correction",
            f"choose one of {', '.join(CORRECTION_CHOICES)}",
        )
        require(
            self.c_update in C_UPDATE_CHOICES,
            "algorithm_args.c_update",
            f"choose one of {', '.join(C_UPDATE_CHOICES)}",
        )


def variates(r: PartyRound) -> tuple[Tensors, Tensors]:
    """(c, c_i) on the host per trainable parameter, in the model's dtype: zeros for c before the
    first aggregation and for c_i of a party that has not trained yet."""
    c, c_i = r.received.get("c") or {}, r.state.get("c") or {}
    model = r.received["model"]
    out: tuple[Tensors, Tensors] = ({}, {})
    for n in r.trainable:
        dtype = model[n].dtype
        for source, target in ((c, out[0]), (c_i, out[1])):
            target[n] = (
                source[n].detach().cpu().to(dtype)
                if n in source
                else torch.zeros(model[n].shape, dtype=dtype)
            )
    return out


class ScaffoldClient(ClientAlgorithm):
    """The party side: corrected local SGD and the option II control-variate update."""

    name = "scaffold"

    def context(self, r: PartyRound) -> Context:
        """w^t, and the party's correction c - c_i per trainable parameter (its own)."""
        c, c_i = variates(r)
        corr = {n: c[n] - c_i[n] for n in c}
        return Context(r.received["model"], self.train_args.learning_rate, {}, {"corr": corr})

    def before_step(self, params: dict, grads: dict, ctx: dict, rows: torch.Tensor | None) -> None:
        """ "gradient": g <- g + c - c_i, the corrected direction of Algorithm 1 line 10."""
        if self.options.correction == "gradient":
            for n, corr in ctx["corr"].items():
                add_rows(grads[n], corr, rows, 1.0)

    def after_step(self, params: dict, ctx: dict, rows: torch.Tensor | None, lr: float) -> None:
        """ "after-step": p <- p - lr (c - c_i) after the optimiser's own step (NIID-Bench's code)."""
        if self.options.correction == "after-step":
            with torch.no_grad():
                for n, corr in ctx["corr"].items():
                    add_rows(params[n], corr, rows, -lr)

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """Option II (Algorithm 1 line 12): c_i+ = c_i - c + (w^t - y_i) / (K eta_l), kept; uploads
        {"model": y_i, "delta_c": c_i+ - c_i, "party_id"} (line 13)."""
        c, c_i = variates(r)
        steps, new = done.steps, {}
        for n in r.trainable:
            if steps == 0:
                new[n] = c_i[n].clone()
            else:
                start = ctx.start[n].detach().cpu().to(c_i[n].dtype)
                drift = (start - done.final[n].detach().cpu()) / (steps * ctx.lr)
                new[n] = c_i[n] - c[n] + drift
        r.state["c"] = new
        payload = super().finish(r, ctx, done)
        payload["delta_c"] = {n: new[n] - c_i[n] for n in new}
        return payload


class ScaffoldServer(ServerAlgorithm):
    """Sends (w, c); averages the models and moves c by the parties' mean control-variate change."""

    summed: ClassVar[dict[str, str]] = {"model": UPDATE, "delta_c": SUM}
    # server_args.aggregation: buffered (fedml_moon.core.buffering.buffer_refusal)
    not_buffered: ClassVar[str] = (
        "a party's delta_c is its control variate's change against the c it was sent, and its correction "
        "c - c_i used that c; a stale delta_c added to a newer c is no longer SCAFFOLD's line 17 (FedBuff "
        "derives no staleness rule for control variates)"
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.c: Tensors = {}  # filled from the first uploads' delta_c names (parameters, not buffers)

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """The model, and delta_c for every trainable parameter."""
        spec = super().upload_spec(global_state, party_id)
        spec["delta_c"] = {n: global_state[n] for n in self.trainable}
        return spec

    def state(self) -> dict:
        return {**super().state(), "c": dict(self.c)}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.c = dict(state["c"])

    def download(self, global_state: OrderedDict, party_id: int | None = None) -> Payload:
        """{"model": x, "c": c} (Algorithm 1 line 5); c is {} before the first aggregation (zeros)."""
        return {"model": global_state, "c": self.c}

    def aggregate(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        """x <- x + eta_g (avg_S(y_i) - x) (line 16, eta_g = server_args.server_lr, applied by the base
        class with any server momentum) and c <- c + |S|/N mean_S(delta c_i) (line 17)."""
        averaged = super().aggregate(global_state, uploads)
        deltas = [{n: t.detach().cpu() for n, t in p["delta_c"].items()} for _, p in uploads]
        self.move_c(self.mean.total(deltas), len(deltas))  # sum_S delta c_i; robust: |S| x the rule's mean_S
        return averaged

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        """The same two lines from the round's sums: the mean update, and sum_S delta c_i."""
        averaged = super().aggregate_sums(global_state, sums)
        dtype = torch.get_default_dtype()  # the model's (train_args.precision: fp64 makes it float64)
        self.move_c({n: t.to(dtype) for n, t in sums.fields["delta_c"].items()}, sums.count)
        return averaged

    def move_c(self, totals: Tensors, count: int) -> None:
        """c <- c + sum_S delta c_i / N ("paper"), or / |S| (the mean over the parties that reported)."""
        paper = self.options.c_update == "paper"
        n_total = float(self.train_args.client_num_in_total if paper else count)
        new_c: Tensors = {}
        for name, total in totals.items():  # paper: |S|/N * mean_S == sum_S / N
            old = self.c.get(name)
            new_c[name] = total / n_total if old is None else old + total / n_total
        self.c = new_c  # a new dict: payloads already sent keep the c they were given
