"""A model plugin: a small convolutional encoder with GroupNorm (no running statistics, so every
party's normalisation travels with its weights). Name it in a config as

    model_args:
      model: examples/networks/groupnorm_cnn.py:encoder

(from the repository root), or `groupnorm_cnn:encoder` with this folder on the Python path or
beside the config. fedml-moon calls `encoder((channels, height, width))` with the data's input
shape and puts MOON's projection head and the classifier on what it returns.
"""

from __future__ import annotations

import torch
from torch import nn


class GroupNormCNN(nn.Module):
    """Three 3x3 convolutions (32, 64, 128 channels), each with GroupNorm(8) and ReLU, the first two
    followed by 2x2 max-pooling, then global average pooling: [B, C, H, W] -> [B, 128]."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        widths = (channels, 32, 64, 128)
        for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.GroupNorm(8, b), nn.ReLU()]
            if i < 2:
                layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.out_features = 128  # the width fedml-moon reads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).mean(dim=(2, 3))


def encoder(input_shape: tuple[int, int, int]) -> nn.Module:
    """The encoder for inputs of (channels, height, width)."""
    return GroupNormCNN(input_shape[0])
