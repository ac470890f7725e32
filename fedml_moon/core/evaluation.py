"""Evaluation of a model on a loader of (x, y) batches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate_counts(model: nn.Module, loader: Iterable, device: torch.device) -> tuple[int, int, float]:
    """(correct, seen, loss sum) of `model` (a `ModelOutput`) over `loader`: top-1 hits, samples and
    the summed cross-entropy (float64), the counts a site reports in federated evaluation."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x).logits
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum()
        count += y.numel()
    model.train(was_training)
    return int(correct), count, float(loss_sum)


def evaluate(model: nn.Module, loader: Iterable, device: torch.device) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of `model` (a `ModelOutput`) over `loader`."""
    correct, count, loss_sum = evaluate_counts(model, loader, device)
    return ratios(correct, count, loss_sum)


def ratios(correct: int, seen: int, loss_sum: float) -> tuple[float, float]:
    """(accuracy, mean loss) from counts; (0, 0) for no samples."""
    return (correct / seen, loss_sum / seen) if seen else (0.0, 0.0)


@torch.no_grad()
def evaluate_ensemble_counts(
    model: nn.Module, states: Sequence[Mapping[str, torch.Tensor]], loader: Iterable, device: torch.device
) -> tuple[int, int, float]:
    """(correct, seen, negative log-likelihood sum) of the ensemble that averages the softmax outputs
    of `states` (one model each) over `loader`."""
    batches = [(x.to(device), y.to(device)) for x, y in loader]
    probs = [torch.zeros(len(y), 0, device=device) for _, y in batches]
    was_training = model.training
    model.eval()
    for i, state in enumerate(states):
        model.load_state_dict(state)
        for b, (x, _) in enumerate(batches):
            p = torch.softmax(model(x).logits, dim=1)
            probs[b] = p if i == 0 else probs[b] + p
    model.train(was_training)
    correct, nll, count = 0, 0.0, 0
    for (_, y), p in zip(batches, probs, strict=True):
        p = p / len(states)
        correct += int((p.argmax(1) == y).sum())
        nll += float(-torch.log(p.gather(1, y.unsqueeze(1)).clamp_min(1e-12)).sum())
        count += len(y)
    return correct, count, nll


def evaluate_ensemble(
    model: nn.Module, states: Sequence[Mapping[str, torch.Tensor]], loader: Iterable, device: torch.device
) -> tuple[float, float]:
    """Accuracy and loss of the ensemble that averages the softmax outputs of `states` (one model each)."""
    return ratios(*evaluate_ensemble_counts(model, states, loader, device))
