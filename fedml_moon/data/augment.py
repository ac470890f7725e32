"""Batched training augmentations on float image tensors, the tensor equivalents of MOON's transforms.

* ``"cifar10"``: RandomCrop(32, padding=4, padding_mode="reflect") + RandomHorizontalFlip (MOON, CIFAR-10).
* ``"cifar100"``: RandomCrop(32, padding=4) + RandomHorizontalFlip + RandomRotation(15) (MOON, CIFAR-100).
* ``"crop-flip"``: RandomCrop(32, padding=4) + RandomHorizontalFlip (zero padding; LG-FedAvg's CIFAR-10).

Every random draw comes from the given ``torch.Generator``, so a seed fixes the output.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fedml_moon.config.schema import AUGMENTATIONS  # noqa: F401 (the names this module implements)

PAD = 4
MAX_ROTATION_DEG = 15.0


def _random_crop(padded: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Per-sample crop: out[b] = padded[b, :, oy[b]:oy[b]+h, ox[b]:ox[b]+w]; [B,C,H+2p,W+2p] -> [B,C,H,W]."""
    b, c, _, wp = padded.shape
    rows = oy[:, None] + torch.arange(h, device=padded.device)
    cols = ox[:, None] + torch.arange(w, device=padded.device)
    out = padded.gather(2, rows[:, None, :, None].expand(b, c, h, wp))
    return out.gather(3, cols[:, None, None, :].expand(b, c, h, w))


class Draw(NamedTuple):
    """One batch's random draws, [B] each: crop offsets, flips, rotation angles (None unless cifar100)."""

    oy: torch.Tensor
    ox: torch.Tensor
    flip: torch.Tensor
    angle: torch.Tensor | None = None


def draw(kind: str, b: int, generator: torch.Generator) -> Draw | None:
    """The random draws of a batch of `b` samples for augmentation `kind` (None for `none`), made on
    `generator` (on its device) in a fixed order: crop rows, crop columns, flips, then angles."""
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; choose one of {', '.join(AUGMENTATIONS)}")
    if kind == "none" or b == 0:
        return None
    gdev = generator.device
    oy = torch.randint(0, 2 * PAD + 1, (b,), generator=generator, device=gdev)
    ox = torch.randint(0, 2 * PAD + 1, (b,), generator=generator, device=gdev)
    flip = torch.rand(b, generator=generator, device=gdev) < 0.5
    angle = None
    if kind == "cifar100":
        angle = (2.0 * torch.rand(b, generator=generator, device=gdev) - 1.0) * MAX_ROTATION_DEG
    return Draw(oy, ox, flip, angle)


def join(draws: list[Draw | None]) -> Draw | None:
    """Several batches' draws as one, in order (for one augmentation of the stacked batches)."""
    if not draws or draws[0] is None:
        return None
    angles = [d.angle for d in draws]
    angle = None if angles[0] is None else torch.cat(angles)
    return Draw(
        torch.cat([d.oy for d in draws]),
        torch.cat([d.ox for d in draws]),
        torch.cat([d.flip for d in draws]),
        angle,
    )


def apply(x: torch.Tensor, kind: str, drawn: Draw | None) -> torch.Tensor:
    """Augment a float batch [B,C,H,W] (values in [0, 1]) with the draws `drawn` ([B] each); each
    sample's output depends only on that sample and its draws, so a stacked batch augments as its parts."""
    if drawn is None:
        return x
    b, _, h, w = x.shape
    mode = "reflect" if kind == "cifar10" else "constant"
    padded = F.pad(x, (PAD, PAD, PAD, PAD), mode=mode)
    dev = x.device
    out = _random_crop(padded, drawn.oy.to(dev), drawn.ox.to(dev), h, w)
    out = torch.where(drawn.flip.to(dev)[:, None, None, None], out.flip(3), out)
    return out if drawn.angle is None else rotate_batch(out, drawn.angle)


def rotate_batch(x: torch.Tensor, angles_deg: torch.Tensor) -> torch.Tensor:
    """Rotate each image of [B,C,H,W] about its centre by angles_deg [B] (counter-clockwise).

    Nearest-neighbour sampling with zero fill, as torchvision's RandomRotation defaults.
    """
    _, _, h, w = x.shape
    a = angles_deg.to(device=x.device, dtype=x.dtype) * (math.pi / 180.0)
    cos, sin = torch.cos(a), torch.sin(a)
    zero = torch.zeros_like(a)
    theta = torch.stack(
        [torch.stack([cos, -sin * (h / w), zero], 1), torch.stack([sin * (w / h), cos, zero], 1)], 1
    )
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def augment_batch(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Augment a float batch [B,C,H,W] (values in [0, 1], before normalisation); returns [B,C,H,W].

    ``kind`` is one of ``AUGMENTATIONS``; random numbers are drawn on ``generator``'s device.
    """
    return apply(x, kind, draw(kind, x.shape[0], generator))
