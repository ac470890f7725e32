"""The four encoders built in (`model_args.model`): MOON's and LG-FedAvg's CNNs, LG-FedAvg's MLP and
ResNet-50 with a CIFAR stem. Each maps [B, C, H, W] to [B, out_features]. Pure PyTorch."""

from __future__ import annotations

import torch
from torch import nn

from fedml_moon.core.choices import BUILT_IN


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
        import torchvision  # a second to import: only where this network is built

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


def built_in_encoder(name: str, input_shape: tuple[int, int, int]) -> nn.Module:
    """The built-in encoder `name` (one of BUILT_IN) for inputs of (channels, height, width)."""
    channels, height, width = input_shape
    if name in ("simple-cnn", "lg-cnn"):
        if height != width or height not in (28, 32):
            raise ValueError(
                f"{name} takes 28x28 or 32x32 images; got {height}x{width} (resnet50, mlp and the "
                "torchvision and timm networks take other sizes)"
            )
        return SimpleCNNEncoder(channels, height, 84 if name == "simple-cnn" else 100)
    if name == "resnet50":
        return ResNet50Encoder(channels)
    if name == "mlp":
        return MLPEncoder(channels * height * width)
    raise ValueError(f"{name!r} is not built in; the encoders built in: {', '.join(BUILT_IN)}")
