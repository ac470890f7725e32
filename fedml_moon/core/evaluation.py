"""Evaluation of a model on a loader of (x, y) batches."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of `model` (forward -> (h, z, logits)) over `loader`."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)[2]
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum()
        count += y.numel()
    model.train(was_training)
    if count == 0:
        return 0.0, 0.0
    return float(correct) / count, float(loss_sum) / count
