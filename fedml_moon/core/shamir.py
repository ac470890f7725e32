"""Shamir's t-of-n secret sharing over the prime field GF(2^127 - 1) (Shamir, CACM 1979), the
building block secure aggregation (Bonawitz et al., CCS 2017, Sec. 3) uses to recover the mask seeds
of parties that drop out. Pure Python integers; randomness from `secrets`.

A secret s < P is the constant term of a random polynomial f of degree t - 1; share i is (i, f(i)) for
i = 1..n. Any t shares give s back by Lagrange interpolation at 0; any t - 1 of them are consistent
with every possible secret (perfect hiding).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterator, Sequence

P = 2**127 - 1  # a Mersenne prime: 16-byte secrets below it, 126-bit seeds always fit
Share = tuple[int, int]
RECOVER_TRIES = 1000  # t-subsets `recover` interpolates at most


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


def _inverses(values: Sequence[int]) -> list[int]:
    """1 / v mod P for each non-zero v, with a single exponentiation (Montgomery's batch inversion)."""
    prefix, acc = [], 1
    for v in values:
        prefix.append(acc)
        acc = acc * v % P
    inv, out = pow(acc, P - 2, P), [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % P
        inv = inv * values[i] % P
    return out


class Polynomial:
    """The polynomial of degree len(points) - 1 through `points`, in barycentric Lagrange form: its
    weights in O(t^2) once, then each value in O(t) with one inversion."""

    def __init__(self, points: Sequence[Share]) -> None:
        self.xs = [x % P for x, _ in points]
        if len(set(self.xs)) != len(self.xs):
            raise ShareError(f"shares repeat an x coordinate: {sorted(x for x, _ in points)}")
        self.ys = [y % P for _, y in points]
        dens = []
        for i, xi in enumerate(self.xs):
            den = 1
            for j, xj in enumerate(self.xs):
                if i != j:
                    den = den * (xi - xj) % P
            dens.append(den)
        self.weights = _inverses(dens)

    def at(self, x: int) -> int:
        """f(x) mod P."""
        x %= P
        if x in self.xs:
            return self.ys[self.xs.index(x)]
        diffs = [(x - xi) % P for xi in self.xs]
        span, total = 1, 0
        for d, w, y, inv in zip(diffs, self.weights, self.ys, _inverses(diffs), strict=True):
            span = span * d % P
            total = (total + w * y % P * inv) % P
        return span * total % P


def interpolate(points: Sequence[Share], at: int = 0) -> int:
    """The value at `at` of the polynomial of degree len(points) - 1 through `points` (Lagrange)."""
    return Polynomial(points).at(at)


def combine(shares: Sequence[Share], t: int) -> int:
    """The secret from at least t shares (the first t are used); a ShareError when fewer."""
    if len(shares) < t:
        raise ShareError(f"{len(shares)} shares cannot give the secret back: {t} are needed")
    for x, y in shares:
        if not (0 < x < P and 0 <= y < P):
            raise ShareError(f"share ({x}, {y}) is outside the field")
    return interpolate(list(shares)[:t])


def _subsets(m: int, t: int) -> Iterator[tuple[int, ...]]:
    """Every t-subset of range(m) once, by increasing largest element: leaving out one share of the
    first t + 1 comes within t + 1 tries, two of the first t + 2 within (t + 2)(t + 1) / 2, ..."""
    for top in range(t - 1, m):
        for rest in itertools.combinations(range(top), t - 1):
            yield (*rest, top)


def recover(
    shares: Sequence[Share], t: int, check: Callable[[int], bool], max_tries: int = RECOVER_TRIES
) -> tuple[int, list[int]]:
    """The secret that `check` accepts (the owner's commitment, Bonawitz et al. 2017, Fig. 4, round 4)
    from some t of `shares`, and the positions of the shares off its polynomial. With more than t
    shares, wrong ones are stepped around: t-subsets are tried (at most `max_tries`) until one
    rebuilds a secret that `check` accepts. A ShareError when fewer than t shares, or when no subset
    tried gives an accepted secret (too many wrong shares, or exactly t with one wrong)."""
    if len(shares) < t:
        raise ShareError(f"{len(shares)} shares cannot give the secret back: {t} are needed")
    for x, y in shares:
        if not (0 < x < P and 0 <= y < P):
            raise ShareError(f"share ({x}, {y}) is outside the field")
    tries = 0
    for chosen in _subsets(len(shares), t):
        if tries >= max_tries:
            break
        tries += 1
        poly = Polynomial([shares[i] for i in chosen])
        secret = poly.at(0)
        if check(secret):
            return secret, [i for i, (x, y) in enumerate(shares) if i not in chosen and poly.at(x) != y]
    raise ShareError(
        f"none of the {tries} sets of {t} shares tried (of {len(shares)}) rebuilds the committed secret"
    )
