"""FedAvg broken the ways a contributor breaks an algorithm without noticing, for `fedml-moon check`
(`common_args.plugins: tests/broken_plugins.py:NAME`): each runs, and each must fail a check that
names its cause."""

from __future__ import annotations

import random

import torch

from fedml_moon.algorithms.base import Context, NoOptions, PartyRound, ServerAlgorithm, add_rows
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.core.aggregation import clone_state
from fedml_moon.registry import AlgorithmSpec

SEEN: dict[int, int] = {}  # party -> rounds trained: state in a module global


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


__all__ = ["float32", "inplace", "module_global", "on_self", "python_random", "randn"]
