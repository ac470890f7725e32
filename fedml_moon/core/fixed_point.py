"""Fixed-point encoding of float tensors in Z_(2^k), so that sums of masked integers (secure
aggregation) decode to the sum of the floats, up to a stated rounding error. Pure PyTorch.

A value x is clipped to [-clip, clip], scaled by `scale` = 2^bits / (2 clip) and rounded to the
nearest integer, then taken mod 2^k (a negative one wraps). A sum of n encodings mod 2^k, read as a
signed integer in [-2^(k-1), 2^(k-1)), divided by `scale`, is the sum of the clipped values to within
n / (2 scale) per element, provided n * 2^(bits-1) < 2^(k-1) (no wrap-around of the true sum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FixedPoint:
    """Clipping range `clip` > 0, `bits` of resolution over [-clip, clip], modulus 2^`k` (k <= 62 so
    that sums fit in int64)."""

    clip: float = 8.0
    bits: int = 22
    k: int = 32

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"clip must be > 0; got {self.clip}")
        if not 1 <= self.bits < self.k <= 62:
            raise ValueError(f"need 1 <= bits < k <= 62; got bits={self.bits}, k={self.k}")

    @property
    def scale(self) -> float:
        return 2.0**self.bits / (2.0 * self.clip)

    def most_addends(self) -> int:
        """How many encodings can be summed before the true sum may wrap around 2^k."""
        return (2 ** (self.k - 1) - 1) // 2 ** (self.bits - 1)

    def error_bound(self, n: int) -> float:
        """The largest decoding error per element of a sum of n encodings (rounding only)."""
        return n / (2.0 * self.scale)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """int64 in [0, 2^k): round(clip(x) * scale) mod 2^k."""
        q = torch.round(x.double().clamp(-self.clip, self.clip) * self.scale).to(torch.int64)
        return torch.remainder(q, 2**self.k)

    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(a + b) mod 2^k."""
        return torch.remainder(a + b, 2**self.k)

    def decode(self, total: torch.Tensor, n: int) -> torch.Tensor:
        """The float64 sum of the n clipped values whose encodings (mod 2^k) sum to `total`."""
        if n > self.most_addends():
            raise ValueError(
                f"{n} addends may wrap around 2^{self.k} with {self.bits} bits of resolution; "
                f"at most {self.most_addends()}: lower bits or raise k"
            )
        half = 2 ** (self.k - 1)
        signed = torch.where(total >= half, total - 2**self.k, total)
        return signed.double() / self.scale
