"""The arithmetic secure aggregation stands on: Shamir t-of-n sharing (any t shares give the secret,
t - 1 are consistent with every secret, wrong shares are stepped around against a commitment where
more than t came back) and fixed-point sums in Z_(2^k) within their stated bound."""

from __future__ import annotations

import itertools

import pytest
import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.core.shamir import P, ShareError, combine, interpolate, recover, split


def test_any_t_of_n_shares_give_the_secret_back():
    secret = 2**126 + 12345
    shares = split(secret, t=3, n=5)
    assert [x for x, _ in shares] == [1, 2, 3, 4, 5]
    for chosen in itertools.combinations(shares, 3):
        assert combine(chosen, 3) == secret


def test_a_hand_checked_polynomial():
    """f(x) = 7 + 3x: shares (1, 10) and (2, 13) give f(0) = 7; (1, 10) and (3, 16) too."""
    assert interpolate([(1, 10), (2, 13)]) == 7
    assert interpolate([(3, 16), (1, 10)]) == 7
    assert interpolate([(1, 10), (2, 13)], at=5) == 22


def test_t_minus_one_shares_are_consistent_with_every_secret():
    """Perfect hiding: through t - 1 shares and (0, s') passes a polynomial of degree t - 1 for any
    candidate s', so the shares say nothing of which secret it was."""
    shares = split(42, t=3, n=5)[:2]
    for candidate in (0, 1, 42, P - 1):
        through = [(0, candidate), *shares]
        assert interpolate(through, at=0) == candidate
        assert [interpolate(through, at=x) for x, _ in shares] == [y for _, y in shares]


def test_too_few_repeated_or_foreign_shares_are_refused():
    shares = split(9, t=3, n=4)
    with pytest.raises(ShareError, match="2 shares cannot give the secret back: 3 are needed"):
        combine(shares[:2], 3)
    with pytest.raises(ShareError, match="repeat an x coordinate"):
        combine([shares[0], shares[0], shares[1]], 3)
    with pytest.raises(ShareError, match="outside the field"):
        combine([(0, 1), *shares[:2]], 3)
    with pytest.raises(ShareError, match=r"threshold t must be in \[1, n\]"):
        split(9, t=5, n=4)
    with pytest.raises(ShareError, match="secret must be an integer"):
        split(P, t=2, n=3)


def test_a_tampered_share_gives_another_secret():
    shares = split(1234, t=2, n=3)
    x, y = shares[0]
    assert combine([(x, (y + 1) % P), shares[1]], 2) != 1234


def test_recover_steps_around_wrong_shares_that_the_commitment_exposes():
    """10 shares, t = 4: with 3 wrong the committed secret is found and the wrong ones named; the search
    is bounded, and with exactly t shares one wrong one cannot be stepped around."""
    secret = 2**100 + 7
    shares = split(secret, t=4, n=10)
    wrong = [(x, (y + 1) % P) if i in (0, 2, 7) else (x, y) for i, (x, y) in enumerate(shares)]
    assert recover(wrong, 4, lambda s: s == secret) == (secret, [0, 2, 7])
    with pytest.raises(ShareError, match="none of the 5 sets of 4 shares tried"):
        recover(wrong, 4, lambda s: s == secret, max_tries=5)
    with pytest.raises(ShareError, match="none of the 1 sets of 4 shares tried"):
        recover(wrong[:4], 4, lambda s: s == secret)
    with pytest.raises(ShareError, match="3 shares cannot give the secret back"):
        recover(shares[:3], 4, lambda s: True)
    assert recover(shares, 4, lambda s: s == secret) == (secret, [])


def test_fixed_point_sums_decode_within_the_stated_bound():
    fp = FixedPoint(clip=8.0, bits=22, k=32)
    assert fp.scale == 2**22 / 16 and fp.most_addends() == 1023
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(1000, generator=g, dtype=torch.float64) * 3 for _ in range(10)]
    total = fp.encode(values[0])
    for v in values[1:]:
        total = fp.add(total, fp.encode(v))
    exact = sum(v.clamp(-8, 8) for v in values)
    error = float((fp.decode(total, 10) - exact).abs().max())
    assert error <= fp.error_bound(10) == 10 / (2 * 2**22 / 16)
    assert error > 0  # rounding is there, and within the bound


def test_fixed_point_hand_checked_values_and_clipping():
    fp = FixedPoint(clip=1.0, bits=3, k=8)  # scale 4: steps of 0.25; modulus 256
    enc = fp.encode(torch.tensor([0.25, -0.25, 0.3, 5.0, -5.0]))
    assert enc.tolist() == [1, 255, 1, 4, 252]  # -1 wraps to 255; 5.0 clips to 1.0 -> 4
    assert fp.decode(fp.add(enc[0], enc[1]), 2).item() == 0.0
    assert fp.decode(torch.tensor(252), 1).item() == -1.0


def test_more_addends_than_the_modulus_holds_are_refused():
    fp = FixedPoint(clip=1.0, bits=3, k=8)
    assert fp.most_addends() == 31  # 31 * 4 = 124 < 128
    with pytest.raises(ValueError, match="32 addends may wrap around 2\\^8"):
        fp.decode(torch.tensor(0), 32)
    with pytest.raises(ValueError, match="need 1 <= bits < k <= 62"):
        FixedPoint(bits=40, k=32)
