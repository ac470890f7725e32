"""DP-FedAvg's arithmetic: flat clipping, Gaussian noise and its shares (the accountant: test_accountant)."""

from __future__ import annotations

import math

import pytest
import torch

from fedml_moon.privacy.dp import clip_to_norm, gaussian_noise, noise_std

DRAWS = 200_000


def test_clip_scales_a_long_vector_to_the_norm():
    clipped, norm = clip_to_norm(torch.tensor([3.0, 4.0], dtype=torch.float64), 1.0)
    assert norm == 5.0
    assert torch.allclose(clipped, torch.tensor([0.6, 0.8], dtype=torch.float64), rtol=0, atol=1e-15)


def test_clip_leaves_a_short_vector_unchanged():
    vector = torch.tensor([0.3, 0.4], dtype=torch.float64)
    clipped, norm = clip_to_norm(vector, 1.0)
    assert norm == pytest.approx(0.5, abs=1e-15)
    assert torch.equal(clipped, vector)


def test_clip_keeps_a_zero_vector_zero():
    clipped, norm = clip_to_norm(torch.zeros(7), 1.0)
    assert norm == 0.0
    assert torch.equal(clipped, torch.zeros(7))


def test_clip_returns_the_input_dtype_and_never_exceeds_the_norm():
    clipped, norm = clip_to_norm(torch.tensor([3.0, 4.0], dtype=torch.float32), 1.0)
    assert clipped.dtype == torch.float32 and norm == 5.0
    assert torch.allclose(clipped, torch.tensor([0.6, 0.8]), atol=1e-7)
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for scale in (1e-2, 1.0, 10.0):  # entries stay within float16's range
            vector = (torch.randn(4, 1000, generator=generator) * scale * 100).to(dtype)
            clip = 0.37 * scale
            clipped, _ = clip_to_norm(vector, clip)
            assert clipped.shape == vector.shape and clipped.dtype == dtype
            assert float(torch.linalg.vector_norm(clipped.to(torch.float64))) <= clip


def test_clip_refuses_non_finite_vectors_and_bad_norms():
    with pytest.raises(ValueError, match="non-finite"):
        clip_to_norm(torch.tensor([1.0, float("nan")]), 1.0)
    for clip in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="clipping norm"):
            clip_to_norm(torch.ones(3), clip)


def test_noise_has_the_asked_std_and_zero_mean():
    # Sample std's standard error is std / sqrt(2 (n - 1)), the mean's std / sqrt(n): 4 of each allowed.
    std = 0.5
    draws = gaussian_noise(torch.zeros(DRAWS), std, torch.Generator().manual_seed(1)).to(torch.float64)
    assert draws.shape == (DRAWS,) and draws.dtype == torch.float64
    assert abs(float(draws.std()) - std) <= 4 * std / math.sqrt(2 * (DRAWS - 1))
    assert abs(float(draws.mean())) <= 4 * std / math.sqrt(DRAWS)


def test_noise_without_a_generator_is_fresh_and_with_one_repeats():
    zeros = torch.zeros(64, dtype=torch.float64)
    torch.manual_seed(0)
    first = gaussian_noise(zeros, 1.0)
    torch.manual_seed(0)
    assert not torch.equal(first, gaussian_noise(zeros, 1.0))
    again = [gaussian_noise(zeros, 1.0, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(again[0], again[1])
    assert gaussian_noise(torch.zeros(3, 2, dtype=torch.float16), 1.0).dtype == torch.float16


def test_noise_shares_sum_to_sigma_times_clip():
    # 9 shares of std 1 sum to std sigma * C = 3; 4 standard errors of the sample std allowed.
    assert noise_std(2.0, 1.5, 9) == 1.0
    assert noise_std(2.0, 1.5) == 3.0
    generator = torch.Generator().manual_seed(2)
    total = sum(
        gaussian_noise(torch.zeros(DRAWS, dtype=torch.float64), noise_std(2.0, 1.5, 9), generator)
        for _ in range(9)
    )
    assert abs(float(total.std()) - 3.0) <= 4 * 3.0 / math.sqrt(2 * (DRAWS - 1))
    with pytest.raises(ValueError, match="shares"):
        noise_std(1.0, 1.0, 0)


def test_fedssc_flags_are_clipped_with_the_update_as_the_privacy_page_says():
    """privacy.md: at C = 1 a party holding 6 classes whose update has norm 0.5 adds 0.20 of it; its
    class flags are inside the clipped part (scaled with the update), so epsilon covers them."""
    from fedml_moon.algorithms.fedssc import FedSSCServer
    from fedml_moon.privacy.party import Plan, party_vector
    from fedml_moon.privacy.sums import unflatten

    received = {"model": {"w": torch.zeros(4)}}
    present = torch.tensor([True] * 6 + [False] * 4)
    upload = {
        "model": {"w": torch.tensor([0.3, 0.4, 0.0, 0.0])},  # an update of norm 0.5
        "prototypes": torch.zeros(10, 3),  # this test counts the flags alone
        "present": present,
    }
    plan = Plan(dict(FedSSCServer.summed), ratio=1.0, clip=1.0)
    got = party_vector(upload, received, plan)
    fields, _ = unflatten(got.vector, got.entries, [])
    assert math.isclose(got.norm, math.sqrt(0.25 + 6))
    scale = 1 / math.sqrt(0.25 + 6)  # 0.4
    assert torch.allclose(
        fields["model"]["w"], torch.tensor([0.3, 0.4, 0.0, 0.0], dtype=torch.float64) * scale
    )
    assert math.isclose(float(fields["model"]["w"].norm()), 0.2, rel_tol=1e-6)  # 0.5 x 0.4
    assert torch.allclose(fields["present"], present.double() * scale)  # clipped with it
