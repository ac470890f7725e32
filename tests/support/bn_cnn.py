"""A model plugin for tests: a small convolutional encoder with BatchNorm (running statistics that
travel as model entries), cheap enough for a test's runs: [B, C, H, W] -> [B, 64]."""

from __future__ import annotations

from pathlib import Path

from torch import nn

REF = f"{Path(__file__).resolve()}:encoder"  # model_args.model's value


def encoder(input_shape: tuple[int, int, int]) -> nn.Module:
    """Conv(8) + BatchNorm + ReLU + 2x2 max-pool, Conv(16) + BatchNorm + ReLU, 2x2 average pool."""
    net = nn.Sequential(
        nn.Conv2d(input_shape[0], 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
    )
    net.out_features = 64
    return net
