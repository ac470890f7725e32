"""FedAvg whose every local step takes STEP_S longer (`common_args.plugins: tests.support.slow_plugin:slow`):
a local round many heartbeat periods long, as the papers' CIFAR rounds are on a busy machine."""

from __future__ import annotations

import time

from fedml_moon.algorithms.base import NoOptions, ServerAlgorithm
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.registry import AlgorithmSpec

STEP_S = 0.5


class SlowClient(FedAvgClient):
    """FedAvg; each step sleeps first (the main thread busy, as with a long local round)."""

    name = "fedavg_slow"

    def loss(self, net, x, y, ctx):
        time.sleep(STEP_S)
        return super().loss(net, x, y, ctx)


def slow() -> AlgorithmSpec:
    return AlgorithmSpec("fedavg_slow", SlowClient, ServerAlgorithm, NoOptions, "FedAvg with slow steps")


__all__ = ["slow"]
