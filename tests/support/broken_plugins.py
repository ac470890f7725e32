"""FedAvg broken the ways a contributor breaks an algorithm without noticing, for `fedml-moon check`
(`common_args.plugins: tests/support/broken_plugins.py:NAME`): each runs, and each must fail a check that
names its cause. The module's constants (ALPHA, SCALE) are read and never changed."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import ClassVar

import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import Context, NoOptions, PartyRound, ServerAlgorithm, add_rows
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.core.aggregation import clone_state
from fedml_moon.registry import AlgorithmSpec

SEEN: dict[int, int] = {}  # party -> rounds trained: state in a module global
LINEAR: dict[int, dict[str, torch.Tensor]] = {}  # party -> FedDyn's linear term, in a module global
HISTORY: list[float] = []  # every party's last loss, appended: a module-level list
DRIFT = torch.zeros(())  # the sum of every upload's first entry, added in place: a module-level tensor
ALPHA = 0.01  # FedDyn's alpha: a constant, read and never changed
SCALE = torch.ones(())  # a constant tensor, read and never changed


class InPlaceClient(FedAvgClient):
    """Nudges the model it received, in place, before training from it."""

    name = "broken_inplace"

    def context(self, r: PartyRound) -> Context:
        first = next(k for k, v in r.received["model"].items() if v.is_floating_point())
        r.received["model"][first].mul_(0.99)
        return super().context(r)


class GlobalRandomClient(FedAvgClient):
    """Adds noise to its upload from torch's global random state."""

    name = "broken_randn"

    def finish(self, r, ctx, done):
        upload = super().finish(r, ctx, done)
        first = next(k for k, v in upload["model"].items() if v.is_floating_point())
        upload["model"][first] = upload["model"][first] + 1e-3 * torch.randn(upload["model"][first].shape)
        return upload


class PythonRandomServer(ServerAlgorithm):
    """Scales the average by a draw from Python's `random`."""

    def combine(self, global_state, uploads):
        averaged = super().combine(global_state, uploads)
        scale = 1.0 + 1e-3 * random.random()
        return type(averaged)((k, v * scale if v.is_floating_point() else v) for k, v in averaged.items())


class SelfStateClient(FedAvgClient):
    """Counts each party's rounds on the object and trains faster with each: state kept on self."""

    name = "broken_self"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[int, int] = {}

    def context(self, r: PartyRound) -> Context:
        count = self.seen.get(r.party, 0)
        self.seen[r.party] = count + 1
        return Context(clone_state(r.received["model"]), self.train_args.learning_rate * (1 + count))


class GlobalStateClient(FedAvgClient):
    """The same, counting in a module global."""

    name = "broken_global"

    def context(self, r: PartyRound) -> Context:
        count = SEEN.get(r.party, 0)
        SEEN[r.party] = count + 1
        return Context(clone_state(r.received["model"]), self.train_args.learning_rate * (1 + count))


class Float32Client(FedAvgClient):
    """Adds a float32 tensor into the parameters after each step, whatever the run's precision."""

    name = "broken_float32"

    def after_step(self, params, ctx, rows, lr):
        for value in params.values():
            add_rows(value, torch.zeros(value.shape, dtype=torch.float32), rows, 1.0)


class FedDynGlobalClient(FedAvgClient):
    """FedDyn (Acar et al. 2021) as written from the docs, each party's linear term (the gradient
    correction g_k) kept in the module global LINEAR instead of PartyRound.state."""

    name = "broken_feddyn"
    terms = ("ce", "dyn")

    def context(self, r: PartyRound) -> Context:
        anchor = {n: r.received["model"][n] for n in r.trainable}
        linear = LINEAR.get(r.party) or {n: torch.zeros_like(t) for n, t in anchor.items()}
        lr = self.train_args.learning_rate
        return Context(r.received["model"], lr, {"anchor": anchor}, {"linear": linear})

    def loss(self, net, x, y, ctx):
        ce = F.cross_entropy(net(x).logits, y)
        dyn = sum(
            ALPHA / 2 * (net.params[n] - a).pow(2).sum() - (ctx["linear"][n] * net.params[n]).sum()
            for n, a in ctx["anchor"].items()
        )
        return ce + dyn, {"ce": ce.detach(), "dyn": dyn.detach()}

    def finish(self, r, ctx, done):
        old = LINEAR.get(r.party) or {n: torch.zeros_like(done.final[n]) for n in r.trainable}
        LINEAR[r.party] = {n: old[n] - ALPHA * (done.final[n] - ctx.start[n]).detach() for n in r.trainable}
        return super().finish(r, ctx, done)


class FedDynServer(ServerAlgorithm):
    """FedDyn's server, correct: h <- h - alpha (mean - w), w <- mean - h / alpha; h checkpointed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.h: dict[str, torch.Tensor] = {}

    def step(self, global_state, averaged):
        out = OrderedDict(super().step(global_state, averaged))
        for n in self.trainable:
            self.h[n] = self.h.get(n, torch.zeros_like(out[n])) - ALPHA * (out[n] - global_state[n])
            out[n] = out[n] - self.h[n] / ALPHA
        return out

    def state(self) -> dict:
        return {**super().state(), "h": dict(self.h)}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.h = dict(state["h"])


class KeepingClient(FedAvgClient):
    """FedAvg that keeps a class attribute changed in place, a module-level list and a module-level
    tensor, and reads the module's constants (which stay as imported)."""

    name = "broken_keeping"
    rounds: ClassVar[dict[int, int]] = {}  # party -> rounds trained: a class attribute changed in place

    def context(self, r: PartyRound) -> Context:
        self.rounds[r.party] = self.rounds.get(r.party, 0) + 1
        lr = self.train_args.learning_rate * float(SCALE) * (1 + ALPHA * len(HISTORY))
        return Context(clone_state(r.received["model"]), lr)

    def finish(self, r, ctx, done):
        upload = super().finish(r, ctx, done)
        first = next(v for v in upload["model"].values() if v.is_floating_point())
        HISTORY.append(float(first.reshape(-1)[0]))
        DRIFT.add_(first.reshape(-1)[0].to(DRIFT.dtype))
        return upload


def _spec(client: type, server: type = ServerAlgorithm, name: str = "") -> AlgorithmSpec:
    return AlgorithmSpec(
        name or client.name, client, server, NoOptions, f"FedAvg, broken ({client.__name__})"
    )


def inplace() -> AlgorithmSpec:
    return _spec(InPlaceClient)


def randn() -> AlgorithmSpec:
    return _spec(GlobalRandomClient)


def python_random() -> AlgorithmSpec:
    return _spec(FedAvgClient, PythonRandomServer, "broken_python_random")


def on_self() -> AlgorithmSpec:
    return _spec(SelfStateClient)


def module_global() -> AlgorithmSpec:
    return _spec(GlobalStateClient)


def float32() -> AlgorithmSpec:
    return _spec(Float32Client)


def feddyn() -> AlgorithmSpec:
    return _spec(FedDynGlobalClient, FedDynServer)


def keeping() -> AlgorithmSpec:
    return _spec(KeepingClient)


__all__ = ["feddyn", "float32", "inplace", "keeping", "module_global", "on_self", "python_random", "randn"]
