"""Shamir's t-of-n secret sharing over the prime field GF(2^127 - 1) (Shamir, CACM 1979), the
building block secure aggregation (Bonawitz et al., CCS 2017, Sec. 3) uses to recover the mask seeds
of parties that drop out. Pure Python integers; randomness from `secrets`.

A secret s < P is the constant term of a random polynomial f of degree t - 1; share i is (i, f(i)) for
i = 1..n. Any t shares give s back by Lagrange interpolation at 0; any t - 1 of them are consistent
with every possible secret (perfect hiding).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

P = 2**127 - 1  # a Mersenne prime: 16-byte secrets below it, 126-bit seeds always fit
Share = tuple[int, int]


class ShareError(ValueError):
    """Shares that cannot give a secret back: too few, repeated or out of the field."""


def split(secret: int, t: int, n: int) -> list[Share]:
    """n shares of `secret` (0 <= secret < P), any t of which reconstruct it (1 <= t <= n)."""
    if not 0 <= secret < P:
        raise ShareError(f"the secret must be an integer in [0, 2^127 - 1); got {secret}")
    if not 1 <= t <= n:
        raise ShareError(f"the threshold t must be in [1, n]; got t={t}, n={n}")
    coefficients = [secret] + [secrets.randbelow(P) for _ in range(t - 1)]
    return [(x, _evaluate(coefficients, x)) for x in range(1, n + 1)]


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    """f(x) mod P by Horner's rule (coefficients[0] is the constant term)."""
    y = 0
    for c in reversed(coefficients):
        y = (y * x + c) % P
    return y


def interpolate(points: Sequence[Share], at: int = 0) -> int:
    """The value at `at` of the polynomial of degree len(points) - 1 through `points` (Lagrange)."""
    xs = [x % P for x, _ in points]
    if len(set(xs)) != len(xs):
        raise ShareError(f"shares repeat an x coordinate: {sorted(x for x, _ in points)}")
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (at - xj) % P
                den = den * (xi - xj) % P
        total = (total + yi * num * pow(den, P - 2, P)) % P
    return total


def combine(shares: Sequence[Share], t: int) -> int:
    """The secret from at least t shares (the first t are used); a ShareError when fewer."""
    if len(shares) < t:
        raise ShareError(f"{len(shares)} shares cannot give the secret back: {t} are needed")
    for x, y in shares:
        if not (0 < x < P and 0 <= y < P):
            raise ShareError(f"share ({x}, {y}) is outside the field")
    return interpolate(list(shares)[:t])
