"""Small shared builders for the tests."""

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from fedml_moon.config.schema import TrainArgs
from fedml_moon.core.models import build_model

TINY_RUN = [  # a standalone run of seconds: the conformance kit's tiny setting on 450 + 100 images
    "data_args.max_train_samples=450",
    "data_args.max_test_samples=100",
]


SUMMING = {  # every algorithm with a sum form (privacy, streamed uploads): name -> (config, overrides)
    "fedavg": ("fedavg", []),
    "fedavgm": ("fedavg", ["server_args.server_momentum=0.9"]),
    "fedprox": ("fedprox", []),
    "moon": ("moon", []),
    "scaffold": ("scaffold", ["data_args.partition_method=hetero"]),
    "fedssc": ("fedssc", ["algorithm_args.prototype_mode=mean"]),
    "lg": ("lg", ["algorithm_args.warmup_rounds=0", "data_args.partition_method=hetero"]),
}


def tiny_factory(num_classes: int = 3):
    def factory():
        return build_model("mlp", (1, 4, 4), num_classes, use_head=True, out_dim=8)

    return factory


def tiny_batches(n_batches: int = 3, batch: int = 8, seed: int = 0, num_classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 1, 4, 4, generator=g), torch.randint(0, num_classes, (batch,), generator=g))
        for _ in range(n_batches)
    ]


def train_args(**kw) -> TrainArgs:
    base = dict(epochs=1, batch_size=8, learning_rate=0.05)
    base.update(kw)
    return TrainArgs(**base)


@contextlib.contextmanager
def restored_main() -> Iterator[Callable[[list[str]], int]]:
    """`fedml_moon.cli.main`, with what it sets process-wide (root logger, SIGTERM handler) put back
    afterwards."""
    from fedml_moon.cli import main

    root = logging.getLogger()
    handlers, level, sigterm = root.handlers[:], root.level, signal.getsignal(signal.SIGTERM)
    try:
        yield main
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        signal.signal(signal.SIGTERM, sigterm)


# A test of what only a CUDA device runs: skipped without one, and selected by `pytest -m cuda`
# (benchmarks/gpu_check.sh runs these on a GPU machine). For a parameter: pytest.param(..., marks=CUDA_ONLY).
CUDA_ONLY = (pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))


def cuda_only(test: Callable) -> Callable:
    """Mark `test` as needing a CUDA device (both marks of `CUDA_ONLY`)."""
    for mark in CUDA_ONLY:
        test = mark(test)
    return test


class Stop(Exception):
    """The abrupt end of a process (in-process)."""


def stop_after(monkeypatch: Any, loop: Any, round_idx: int) -> None:
    """Make `loop` (a standalone loop) stop abruptly, raising `Stop`, once round `round_idx`'s record
    is written (metrics.jsonl then holds progress its last checkpoint may not)."""
    recorder = loop.server.recorder
    log_round = recorder.log_round

    def log_then_stop(record: dict) -> None:
        log_round(record)
        if record["round"] == round_idx:
            raise Stop(f"stopped in round {round_idx}")

    monkeypatch.setattr(recorder, "log_round", log_then_stop)
