"""Tiny in-process runs: a few seconds' settings, a small model and batches of noise, the training
settings around them, and a standalone loop stopped as a killed process stops."""

from collections.abc import Callable
from typing import Any

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


def tiny_factory(num_classes: int = 3) -> Callable[[], torch.nn.Module]:
    """A builder of a small MLP (with a projection head) on 1x4x4 inputs, as an algorithm is given one."""

    def factory() -> torch.nn.Module:
        return build_model("mlp", (1, 4, 4), num_classes, use_head=True, out_dim=8)

    return factory


def tiny_batches(
    n_batches: int = 3, batch: int = 8, seed: int = 0, num_classes: int = 3
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded batches of noise for `tiny_factory`'s model, with random labels."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 1, 4, 4, generator=g), torch.randint(0, num_classes, (batch,), generator=g))
        for _ in range(n_batches)
    ]


def train_args(**kw: Any) -> TrainArgs:
    """Training settings of one epoch of batches of 8 at learning rate 0.05; `kw` replaces any."""
    base = dict(epochs=1, batch_size=8, learning_rate=0.05)
    base.update(kw)
    return TrainArgs(**base)


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
