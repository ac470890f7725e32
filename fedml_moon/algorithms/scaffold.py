"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020), a MOON Table 1 baseline.

Control variates c (server) and c_i (party i) cover the model's trainable parameters only (by
state-dict name), never buffers; both start at zeros. Local steps follow Algorithm 1 line 10,
y_i <- y_i - eta_l (g_i(y_i) - c_i + c), and the party's control variate follows option II of
line 12. The server averages models (line 16) and updates c <- c + |S|/N * mean_S(delta c_i) (line 17).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from fedml_moon.algorithms.base import ClientAlgorithm, Payload, ServerAlgorithm
from fedml_moon.config_schema import require

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

    correction: str = "after-step"
    c_update: str = "paper"

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


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters the control variates cover, by state-dict name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


class ScaffoldClient(ClientAlgorithm):
    """The party side: corrected local SGD and the option II control-variate update."""

    name = "scaffold"

    def start_round(
        self, model: nn.Module, received: Payload, state: dict, round_idx: int, party_id: int
    ) -> None:
        """Load w^t; take c (zeros at first contact) and c_i (zeros for a new party)."""
        super().start_round(model, received, state, round_idx, party_id)
        c, c_i = received.get("c") or {}, state.get("c") or {}
        self._params = trainable(model)
        self._c, self._c_i, self._start, self._corr = {}, {}, {}, {}
        for n, p in self._params.items():
            zero = torch.zeros(p.shape, dtype=p.dtype)
            self._c[n] = c[n].detach().cpu().to(p.dtype) if n in c else zero
            self._c_i[n] = c_i[n].detach().cpu().to(p.dtype) if n in c_i else zero
            self._start[n] = p.detach().cpu().clone()
            self._corr[n] = (self._c[n] - self._c_i[n]).to(p.device)
        self._delta_c: Tensors = {}

    def before_step(self, model: nn.Module) -> None:
        """ "gradient": g <- g + c - c_i, the corrected direction of Algorithm 1 line 10."""
        if self.options.correction != "gradient":
            return
        for n, p in self._params.items():
            if p.grad is None:
                p.grad = self._corr[n].clone()
            else:
                p.grad.add_(self._corr[n])

    def after_step(self, model: nn.Module) -> None:
        """ "after-step": p <- p - lr (c - c_i) after the optimiser's own step (NIID-Bench's code)."""
        if self.options.correction != "after-step":
            return
        lr = self.train_args.learning_rate
        with torch.no_grad():
            for n, p in self._params.items():
                p.add_(self._corr[n], alpha=-lr)

    def batched_context(
        self, model: nn.Module, received: Payload, state: dict, round_idx: int, party_id: int
    ) -> dict:
        """The party's correction c - c_i, per trainable parameter."""
        return {"shared": {}, "party": {"corr": dict(self._corr)}}

    def batched_before_step(self, params: dict, ctx: dict, rows: torch.Tensor | None) -> None:
        """`before_step` for the stacked parties `rows`."""
        if self.options.correction != "gradient":
            return
        for n, corr in ctx["corr"].items():
            p = params[n]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            _add_rows(p.grad, corr, rows, 1.0)

    def batched_after_step(self, params: dict, ctx: dict, rows: torch.Tensor | None, lr: float) -> None:
        """`after_step` for the stacked parties `rows`."""
        if self.options.correction != "after-step":
            return
        with torch.no_grad():
            for n, corr in ctx["corr"].items():
                _add_rows(params[n], corr, rows, -self.train_args.learning_rate)

    def end_round(
        self, model: nn.Module, state: dict, round_idx: int, party_id: int, loader: Iterable
    ) -> None:
        """Option II (Algorithm 1 line 12): c_i+ = c_i - c + (w^t - y_i) / (K eta_l); keeps delta c_i."""
        steps, lr = self.steps, self.train_args.learning_rate
        new: Tensors = {}
        for n, p in self._params.items():
            if steps == 0:
                new[n] = self._c_i[n].clone()
            else:
                drift = (self._start[n] - p.detach().cpu()) / (steps * lr)
                new[n] = self._c_i[n] - self._c[n] + drift
        state["c"] = new
        self._delta_c = {n: new[n] - self._c_i[n] for n in new}  # line 13: delta c_i = c_i+ - c_i

    def upload(self, model: nn.Module, state: dict, party_id: int) -> Payload:
        """{"model": y_i, "delta_c": c_i+ - c_i, "party_id"} (Algorithm 1 line 13)."""
        payload = super().upload(model, state, party_id)
        payload["delta_c"] = {n: t.clone() for n, t in self._delta_c.items()}
        return payload


def _add_rows(target: torch.Tensor, source: torch.Tensor, rows: torch.Tensor | None, alpha: float) -> None:
    """target[rows] += alpha * source[rows] (every row when rows is None), in place."""
    if rows is None:
        target.add_(source, alpha=alpha)
    else:
        target.index_add_(0, rows, source.index_select(0, rows), alpha=alpha)


class ScaffoldServer(ServerAlgorithm):
    """Sends (w, c); averages the models and moves c by the parties' mean control-variate change."""

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
        paper = self.options.c_update == "paper"
        n_total = float(self.train_args.client_num_in_total if paper else len(deltas))
        totals = self.mean.total(deltas)  # sum_S delta c_i; robust: |S| x the rule's mean_S
        new_c: Tensors = {}
        for name, total in totals.items():  # paper: |S|/N * mean_S == sum_S / N
            old = self.c.get(name)
            new_c[name] = total / n_total if old is None else old + total / n_total
        self.c = new_c  # a new dict: payloads already sent keep the c they were given
        return averaged
