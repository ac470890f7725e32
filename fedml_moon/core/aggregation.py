"""Server-side arithmetic on state dicts: weighted averaging and server momentum. Pure PyTorch."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> OrderedDict:
    """w = sum_k weights_k / sum(weights) * w_k over every entry, BatchNorm buffers included.

    Sample-count weights over the parties that reported (MOON Algorithm 1, line 7). Integer buffers
    (e.g. BatchNorm's num_batches_tracked) are averaged in float64 and rounded back to their dtype.
    """
    if not states or len(states) != len(weights):
        raise ValueError("need one weight per state and at least one state")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must sum to > 0")
    out: OrderedDict = OrderedDict()
    for key, first in states[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        for state, weight in zip(states, weights, strict=True):
            acc.add_(state[key].to(torch.float64), alpha=float(weight) / total)
        out[key] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


def moves(key: str, value: torch.Tensor, trainable: Collection[str] | None) -> bool:
    """Whether a server step (momentum, an adaptive optimiser) moves this entry: a trainable
    parameter (`trainable` None: every floating-point entry); buffers (BatchNorm's running statistics,
    its counter) take the round's average as it is, since a step could overshoot a variance below 0."""
    return value.is_floating_point() and (trainable is None or key in trainable)


class ServerMomentum:
    """Server momentum on the averaged update (FedAvgM), combinable with any algorithm.

    style "moon" (the MOON authors' code): v = beta * v + (1 - beta) * (w_old - w_avg); w = w_old - lr * v.
    style "fedavgm" (Hsu et al. 2019):      v = beta * v + (w_old - w_avg);              w = w_old - lr * v.
    Only the model's trainable parameters move with momentum: buffers (BatchNorm's running statistics,
    its counter) take the round's average as it is, since momentum would overshoot a variance below
    zero (Hsu et al. apply it to the model's weights).
    """

    def __init__(self, beta: float, style: str = "moon", lr: float = 1.0) -> None:
        if not 0 <= beta < 1:
            raise ValueError(f"server momentum must be in [0, 1); got {beta}")
        if style not in ("moon", "fedavgm"):
            raise ValueError(f"unknown server momentum style {style!r}; choose 'moon' or 'fedavgm'")
        self.beta, self.style, self.lr = beta, style, lr
        self.velocity: dict[str, torch.Tensor] = {}

    def step(
        self,
        old: Mapping[str, torch.Tensor],
        averaged: Mapping[str, torch.Tensor],
        trainable: Collection[str] | None = None,
    ) -> OrderedDict:
        """Return the new global state from the previous one and this round's average; `trainable`:
        the entries that move with momentum (None: every floating-point entry)."""
        out: OrderedDict = OrderedDict()
        damp = (1.0 - self.beta) if self.style == "moon" else 1.0
        for key, avg in averaged.items():
            if not moves(key, avg, trainable):
                out[key] = avg.clone()
                continue
            delta = old[key] - avg
            v = self.velocity.get(key)
            v = damp * delta if v is None else self.beta * v + damp * delta
            self.velocity[key] = v
            out[key] = old[key] - self.lr * v
        return out


def payload_nbytes(payload: Any) -> int:
    """Bytes of tensor data in a payload (nested dicts/lists of tensors); other fields count 0."""
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, Mapping):
        return sum(payload_nbytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_nbytes(v) for v in payload)
    return 0


def payload_numel(payload: Any) -> int:
    """Number of tensor elements (parameters) in a payload."""
    if isinstance(payload, torch.Tensor):
        return payload.numel()
    if isinstance(payload, Mapping):
        return sum(payload_numel(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_numel(v) for v in payload)
    return 0


def clone_state(state: Mapping[str, torch.Tensor], device: str | torch.device = "cpu") -> OrderedDict:
    """Detached copy of a state dict on `device`."""
    return OrderedDict((k, v.detach().to(device, copy=True)) for k, v in state.items())
