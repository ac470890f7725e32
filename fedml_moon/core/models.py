"""MOON's model family: base encoder -> projection head -> output layer on the projection.

Every model's forward returns a `ModelOutput` (h, z, logits): h the encoder's representation [B, d], z the
projection [B, out_dim] that the contrastive losses use (z = h when the head is removed), and
logits [B, C] computed from z (MOON paper Section 3.3.1; appendix B for the head-less variant).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from fedml_moon.core.choices import BUILT_IN, OUTPUT_ACTIVATIONS
from fedml_moon.core.networks import make_encoder

ENCODERS = BUILT_IN  # the encoders built in; networks.kind names the other forms


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
    """Build a MoonNet. `input_shape` is (channels, height, width); `name` a built-in encoder
    (ENCODERS), `torchvision:<name>`, `timm:<name>` or a plugin's `module:function` (`networks`)."""
    return MoonNet(make_encoder(name, input_shape), num_classes, use_head, out_dim, output_activation)
