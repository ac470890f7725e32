"""The server's optimiser on the round's mean update: FedAdam, FedYogi and FedAdagrad (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Algorithm 2), pure PyTorch.

With Delta = x_avg - x (the round's mean change of the model, or a buffer's discounted mean):

    m <- beta1 m + (1 - beta1) Delta
    v <- v + Delta^2                                            (adagrad)
    v <- beta2 v + (1 - beta2) Delta^2                          (adam)
    v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)              (yogi)
    x <- x + eta m / (sqrt(v) + tau)

m starts at 0 and v at tau^2 (Algorithm 2: v_{-1} >= tau^2), without bias correction, as the paper
writes it. Only the model's trainable parameters move this way: buffers (BatchNorm's running
statistics, its counter) take the round's average as it is, as under server momentum.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any

import torch

from fedml_moon.core.aggregation import ServerMomentum, moves
from fedml_moon.core.choices import SERVER_OPTIMIZERS

ADAPTIVE = SERVER_OPTIMIZERS[1:]


class AdaptiveServer:
    """Algorithm 2's server step (module docstring) with its state: the moments m and v per entry."""

    def __init__(self, kind: str, lr: float, beta1: float, beta2: float, tau: float) -> None:
        if kind not in ADAPTIVE:
            raise ValueError(f"unknown server optimiser {kind!r}; choose one of {', '.join(ADAPTIVE)}")
        self.kind, self.lr, self.beta1, self.beta2, self.tau = kind, lr, beta1, beta2, tau
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def second_moment(self, key: str, square: torch.Tensor) -> torch.Tensor:
        """v's update for one entry from Delta^2 (`square`); v starts at tau^2."""
        v = self.v.get(key)
        v = torch.full_like(square, self.tau**2) if v is None else v
        if self.kind == "adagrad":
            return v + square
        if self.kind == "adam":
            return self.beta2 * v + (1 - self.beta2) * square
        return v - (1 - self.beta2) * square * torch.sign(v - square)  # yogi

    def step(
        self,
        old: Mapping[str, torch.Tensor],
        averaged: Mapping[str, torch.Tensor],
        trainable: Collection[str] | None = None,
    ) -> OrderedDict:
        """The new global state from the previous one and the round's average; `trainable`: the
        entries the optimiser moves (None: every floating-point entry)."""
        out: OrderedDict = OrderedDict()
        for key, avg in averaged.items():
            if not moves(key, avg, trainable):
                out[key] = avg.clone()
                continue
            delta = avg.double() - old[key].double()
            m = self.m.get(key)
            m = (1 - self.beta1) * delta if m is None else self.beta1 * m + (1 - self.beta1) * delta
            v = self.second_moment(key, delta * delta)
            self.m[key], self.v[key] = m, v
            out[key] = (old[key].double() + self.lr * m / (v.sqrt() + self.tau)).to(avg.dtype)
        return out

    def state(self) -> dict[str, Any]:
        """The moments, for checkpoints."""
        return {"m": dict(self.m), "v": dict(self.v)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.m, self.v = dict(state["m"]), dict(state["v"])


def server_step(server: Any) -> ServerMomentum | AdaptiveServer | None:
    """The server's step on the round's average that `server_args` asks for: FedAdam, FedYogi or
    FedAdagrad (`server_optimizer`); else server momentum and the server's rate (FedAvgM, SCAFFOLD's
    eta_g); None where the average is taken as it is (sgd, rate 1, no momentum)."""
    if server.server_optimizer != "sgd":
        betas = (server.server_beta1, server.server_beta2)
        return AdaptiveServer(server.server_optimizer, server.server_lr, *betas, server.server_tau)
    if server.server_momentum > 0 or server.server_lr != 1.0:
        return ServerMomentum(server.server_momentum, server.server_momentum_style, server.server_lr)
    return None
