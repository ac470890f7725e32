"""Batched training augmentations on float image tensors, the tensor equivalents of MOON's transforms.

* ``"cifar10"``: RandomCrop(32, padding=4, padding_mode="reflect") + RandomHorizontalFlip (MOON, CIFAR-10).
* ``"cifar100"``: RandomCrop(32, padding=4) + RandomHorizontalFlip + RandomRotation(15) (MOON, CIFAR-100).
* ``"crop-flip"``: RandomCrop(32, padding=4) + RandomHorizontalFlip (zero padding; LG-FedAvg's CIFAR-10).

Every random draw comes from the given ``torch.Generator``, so a seed fixes the output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedml_moon.config_schema import AUGMENTATIONS  # noqa: F401 (the names this module implements)

PAD = 4
MAX_ROTATION_DEG = 15.0


def _random_crop(padded: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Per-sample crop: out[b] = padded[b, :, oy[b]:oy[b]+h, ox[b]:ox[b]+w]; [B,C,H+2p,W+2p] -> [B,C,H,W]."""
    b, c, _, wp = padded.shape
    rows = oy[:, None] + torch.arange(h, device=padded.device)
    cols = ox[:, None] + torch.arange(w, device=padded.device)
    out = padded.gather(2, rows[:, None, :, None].expand(b, c, h, wp))
    return out.gather(3, cols[:, None, None, :].expand(b, c, h, w))


def _crop_flip(x: torch.Tensor, pad_mode: str, generator: torch.Generator) -> torch.Tensor:
    """Pad by ``PAD`` (reflect or zeros), crop back to [B,C,H,W] at a random offset, flip with p=0.5."""
    b, _, h, w = x.shape
    if pad_mode == "reflect":
        padded = F.pad(x, (PAD, PAD, PAD, PAD), mode="reflect")
    else:
        padded = F.pad(x, (PAD, PAD, PAD, PAD), mode="constant", value=0.0)
    gdev = generator.device
    oy = torch.randint(0, 2 * PAD + 1, (b,), generator=generator, device=gdev).to(x.device)
    ox = torch.randint(0, 2 * PAD + 1, (b,), generator=generator, device=gdev).to(x.device)
    flip = (torch.rand(b, generator=generator, device=gdev) < 0.5).to(x.device)
    out = _random_crop(padded, oy, ox, h, w)
    return torch.where(flip[:, None, None, None], out.flip(3), out)


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
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; choose one of {', '.join(AUGMENTATIONS)}")
    if kind == "none" or x.shape[0] == 0:
        return x
    if kind == "cifar10":
        return _crop_flip(x, "reflect", generator)
    out = _crop_flip(x, "zeros", generator)
    if kind == "crop-flip":
        return out
    u = torch.rand(x.shape[0], generator=generator, device=generator.device)
    return rotate_batch(out, (2.0 * u - 1.0) * MAX_ROTATION_DEG)
