"""Tests of the batched augmentations in fedml_moon.data.augment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF

from fedml_moon.data.augment import AUGMENTATIONS, PAD, augment_batch, rotate_batch


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _match_windows(x: torch.Tensor, out: torch.Tensor, pad_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """For each sample find the (offset index, flipped) with out[b] == a window of padded x[b]; -1 if none."""
    h, w = x.shape[2:]
    if pad_mode == "reflect":
        padded = F.pad(x, (PAD,) * 4, mode="reflect")
    else:
        padded = F.pad(x, (PAD,) * 4)
    windows = padded.unfold(2, h, 1).unfold(3, w, 1)  # [B, C, 9, 9, H, W]
    windows = windows.permute(0, 2, 3, 1, 4, 5).flatten(1, 2)  # [B, 81, C, H, W]
    plain = (windows == out[:, None]).flatten(2).all(2)
    flipped = (windows.flip(-1) == out[:, None]).flatten(2).all(2)
    assert not (plain.any(1) & flipped.any(1)).any(), "ambiguous test images"
    offset = torch.where(plain.any(1), plain.float().argmax(1), flipped.float().argmax(1))
    offset[~(plain.any(1) | flipped.any(1))] = -1
    return offset, flipped.any(1)


def test_none_and_unknown_kind() -> None:
    x = torch.rand(2, 3, 32, 32)
    assert augment_batch(x, "none", _gen(0)) is x
    with pytest.raises(ValueError, match="none, cifar10, cifar100"):
        augment_batch(x, "autoaugment", _gen(0))
    assert AUGMENTATIONS == ("none", "cifar10", "cifar100", "crop-flip")


@pytest.mark.parametrize("kind", ["cifar10", "cifar100"])
def test_shape_dtype_and_seed(kind: str) -> None:
    x = torch.rand(16, 3, 32, 32)
    a = augment_batch(x, kind, _gen(1))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, augment_batch(x, kind, _gen(1)))
    assert not torch.equal(a, augment_batch(x, kind, _gen(2)))
    assert augment_batch(x[:0], kind, _gen(1)).shape == (0, 3, 32, 32)


def test_cifar10_outputs_are_windows_of_reflect_padded_input() -> None:
    x = torch.rand(32, 3, 32, 32)
    out = augment_batch(x, "cifar10", _gen(3))
    offset, _ = _match_windows(x, out, "reflect")
    assert (offset >= 0).all()
    assert len(offset.unique()) > 10
    zero_offsets, _ = _match_windows(x, out, "zeros")
    assert (zero_offsets < 0).sum() > 0


def test_cifar10_flip_frequency_and_offsets_cover_all() -> None:
    x = torch.rand(2000, 1, 9, 16)
    out = augment_batch(x, "cifar10", _gen(4))
    offset, flipped = _match_windows(x, out, "reflect")
    assert (offset >= 0).all()
    assert 900 < int(flipped.sum()) < 1100
    assert len(offset.unique()) == (2 * PAD + 1) ** 2


def test_cifar100_zero_fill_and_values() -> None:
    x = torch.ones(64, 3, 32, 32)
    out = augment_batch(x, "cifar100", _gen(5))
    assert set(out.unique().tolist()) == {0.0, 1.0}
    assert (out == 0).flatten(1).any(1).float().mean() > 0.9
    assert (out[:, :, 12:20, 12:20] == 1.0).all()


def test_rotate_zero_is_identity_and_matches_torchvision() -> None:
    x = torch.rand(4, 3, 32, 32)
    assert torch.equal(rotate_batch(x, torch.zeros(4)), x)
    assert torch.equal(rotate_batch(x, torch.full((4,), 90.0)), torch.rot90(x, 1, (2, 3)))
    angles = torch.tensor([-15.0, -7.5, 3.0, 15.0])
    out = rotate_batch(x, angles)
    for b in range(4):
        assert torch.equal(out[b], TF.rotate(x[b], float(angles[b])))


def test_crop_flip_is_a_window_of_the_zero_padded_input() -> None:
    """LG-FedAvg's CIFAR-10 augmentation: torchvision's RandomCrop(32, padding=4) (zeros) + flip."""
    x = torch.rand(64, 3, 32, 32)
    out = augment_batch(x, "crop-flip", _gen(6))
    offset, flipped = _match_windows(x, out, "zeros")
    assert (offset >= 0).all() and 10 < int(flipped.sum()) < 54
    assert not torch.equal(out, augment_batch(x, "cifar100", _gen(6)))  # no rotation
