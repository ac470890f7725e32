"""MOON's model family: base encoder -> projection head -> output layer on the projection.

Every model's forward returns a `ModelOutput` (h, z, logits): h the encoder's representation [B, d], z the
projection [B, out_dim] that the contrastive losses use (z = h when the head is removed), and
logits [B, C] computed from z (MOON paper Section 3.3.1; appendix B for the head-less variant).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torchvision
from torch import nn

ENCODERS = ("simple-cnn", "lg-cnn", "resnet50", "mlp")
OUTPUT_ACTIVATIONS = ("none", "softmax", "log-softmax")


class SimpleCNNEncoder(nn.Module):
    """MOON's CIFAR-10 base encoder: two 5x5 convs (6, 16 channels) with 2x2 max-pool, fc 120, fc 84.

    `fc2_width` 100 gives LG-FedAvg's CIFAR CNN body (fc 120 then 100; its output layer 100 -> 10).
    """

    def __init__(self, in_channels: int, image_size: int, fc2_width: int = 84) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        side = ((image_size - 4) // 2 - 4) // 2  # 5 for 32x32, 4 for 28x28
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, fc2_width)
        self.out_features = fc2_width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))


class ResNet50Encoder(nn.Module):
    """ResNet-50 with a CIFAR stem (3x3 stride-1 first conv, no max-pool); 2048-d output."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        net = torchvision.models.resnet50(weights=None)
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        net.fc = nn.Identity()
        self.net = net
        self.out_features = 2048

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MLPEncoder(nn.Module):
    """LG-FedAvg's MNIST MLP body, 784-512-256-256-128 with ReLU; the output layer is the classifier."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.layer_input = nn.Linear(in_features, 512)
        self.layer_hidden1 = nn.Linear(512, 256)
        self.layer_hidden2 = nn.Linear(256, 256)
        self.layer_hidden3 = nn.Linear(256, 128)
        self.out_features = 128

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        for layer in (self.layer_input, self.layer_hidden1, self.layer_hidden2, self.layer_hidden3):
            x = torch.relu(layer(x))
        return x


class ModelOutput(NamedTuple):
    """What every model of the plugin returns: the encoder's representation `h` [B, d], the
    projection `z` [B, out_dim] (`h` itself without the head) and the classifier's output `logits`
    [B, classes] (MOON Sec. 3.2: base encoder, projection head, output layer)."""

    h: torch.Tensor
    z: torch.Tensor
    logits: torch.Tensor


class MoonNet(nn.Module):
    """encoder -> (optional) projection head Linear(d, d), ReLU, Linear(d, out_dim) -> classifier.

    `output_activation` "softmax" / "log-softmax" applies that to the classifier's output, as
    LG-FedAvg's MLP / CIFAR CNN do before their cross-entropy loss ("none": plain logits).
    """

    def __init__(
        self,
        encoder: nn.Module,
        num_classes: int,
        use_head: bool = True,
        out_dim: int = 256,
        output_activation: str = "none",
    ) -> None:
        super().__init__()
        if output_activation not in OUTPUT_ACTIVATIONS:
            raise ValueError(
                f"output_activation must be one of {OUTPUT_ACTIVATIONS}; got {output_activation!r}"
            )
        self.encoder = encoder
        d = int(encoder.out_features)
        self.use_head = use_head
        self.output_activation = output_activation
        if use_head:
            self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, out_dim))
            self.classifier = nn.Linear(out_dim, num_classes)
        else:
            self.classifier = nn.Linear(d, num_classes)

    def forward(self, x: torch.Tensor) -> ModelOutput:
        h = self.encoder(x)
        z = self.head(h) if self.use_head else h
        out = self.classifier(z)
        if self.output_activation == "softmax":
            out = torch.softmax(out, dim=1)
        elif self.output_activation == "log-softmax":
            out = torch.log_softmax(out, dim=1)
        return ModelOutput(h, z, out)


def build_model(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    use_head: bool = True,
    out_dim: int = 256,
    output_activation: str = "none",
) -> MoonNet:
    """Build a MoonNet. `input_shape` is (channels, height, width); `name` one of ENCODERS."""
    channels, height, width = input_shape
    if name in ("simple-cnn", "lg-cnn"):
        if height != width or height not in (28, 32):
            raise ValueError(f"{name} takes 28x28 or 32x32 images; got {height}x{width}")
        encoder: nn.Module = SimpleCNNEncoder(channels, height, 84 if name == "simple-cnn" else 100)
    elif name == "resnet50":
        encoder = ResNet50Encoder(channels)
    elif name == "mlp":
        encoder = MLPEncoder(channels * height * width)
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(ENCODERS)}")
    return MoonNet(encoder, num_classes, use_head, out_dim, output_activation)
