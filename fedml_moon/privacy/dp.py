"""Client-level differential privacy for federated rounds: DP-FedAvg's arithmetic and its accounting.

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models" (ICLR 2018),
Algorithm 1 (DP-FedAvg): each sampled party's model update Delta_k is clipped to L2 norm C (flat
clipping, ClipFn), the server adds Gaussian noise N(0, sigma^2 C^2 I) to the sum of the m clipped
updates and divides by m, the (public, fixed) number of parties sampled:

    Delta = (sum_k ClipFn(Delta_k, C) + N(0, sigma^2 C^2 I)) / m.

Under secure aggregation the server never sees a noiseless sum, so each sampled party adds its own
share N(0, sigma^2 C^2 / q) (`noise_std(C, sigma, q)`), q the fewest parties a round may complete
with (the quorum of `comm_args.min_reports`; a buffer's K), and no sum of fewer than q is unmasked:
every released sum carries at least N(0, sigma^2 C^2). A sum of k >= q parties carries
sigma^2 C^2 k / q, an effective multiplier sigma sqrt(k / q), and is accounted as such
(`privacy.mod.PrivateAggregation.finish`). Sized for all m sampled, a round where some dropped would
carry less noise than accounted.

The paper samples parties independently (probability q) and tracks the loss with the moments
accountant. Here a round draws a fixed number m of the n parties without replacement, so the privacy
loss is accounted with Google's dp-accounting library under the neighbouring relation that sampling
needs: REPLACE_ONE (one party's data replaced by another's, n public).
"""

from __future__ import annotations

import logging
import math
import numbers
import secrets

import torch

log = logging.getLogger(__name__)


def clip_to_norm(vector: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """(vector * min(1, C / ||vector||_2), ||vector||_2): DP-FedAvg's flat clipping (McMahan et al. 2018,
    Algorithm 1, ClipFn). A zero vector stays zero. Float64 arithmetic, returns the input's dtype.

    vector: any shape, floating point (its norm is that of all its entries); the result has its shape.
    The returned vector's norm (in float64) never exceeds C, rounding to a narrower dtype included.
    A non-finite vector cannot be clipped (its norm is not a number): ValueError.
    """
    if not (isinstance(clip, numbers.Real) and math.isfinite(clip) and clip > 0):
        raise ValueError(f"the clipping norm C must be a finite number > 0; got {clip!r}")
    if not vector.is_floating_point():
        raise ValueError(f"clip_to_norm needs a floating-point tensor; got {vector.dtype}")
    wide = vector.detach().to(torch.float64)
    norm = float(torch.linalg.vector_norm(wide))
    if not math.isfinite(norm):
        raise ValueError(f"cannot clip a vector with non-finite entries (norm {norm})")
    if norm <= clip:
        return vector.clone(), norm
    clipped = (wide * (clip / norm)).to(vector.dtype)
    rounded = float(torch.linalg.vector_norm(clipped.to(torch.float64)))
    if rounded > clip:  # the cast rounded up: shrink by one unit of the dtype's precision
        shrink = clip / rounded * (1.0 - torch.finfo(vector.dtype).eps)
        clipped = (clipped.to(torch.float64) * shrink).to(vector.dtype)
    return clipped, norm


def gaussian_noise(like: torch.Tensor, std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """N(0, std^2) of like's shape and dtype. generator None: a fresh generator seeded from the operating
    system's randomness (`secrets`), so the noise cannot be predicted from the run's seed.

    like: any shape, floating point, on any device (a given generator must be on that device).
    The draws come from torch's generator (not a cryptographic one) in floating point, the usual
    practice for DP training; they carry no defence against floating-point attacks on the sampler.
    """
    if not (isinstance(std, numbers.Real) and math.isfinite(std) and std >= 0):
        raise ValueError(f"the noise's standard deviation must be a finite number >= 0; got {std!r}")
    if not like.is_floating_point():
        raise ValueError(f"gaussian_noise needs a floating-point tensor to match; got {like.dtype}")
    if generator is None:
        generator = torch.Generator(device=like.device)
        generator.manual_seed(secrets.randbits(63))
    noise = torch.randn(like.shape, dtype=like.dtype, device=like.device, generator=generator)
    return noise * std


def noise_std(clip: float, noise_multiplier: float, shares: int = 1) -> float:
    """Standard deviation each of `shares` noise sources adds so that their sum has std sigma * C:
    sigma * C / sqrt(shares) (shares = 1: the server adds all of it).

    Under secure aggregation shares = q, the fewest parties a round may complete with: a sum of
    k >= q parties has std sigma * C * sqrt(k / q), at least the accounted sigma * C.
    """
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"privacy_args.dp_clip_norm must be a finite number > 0; got {clip!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(
            f"privacy_args.dp_noise_multiplier must be a finite number >= 0; got {noise_multiplier!r}"
        )
    if not (isinstance(shares, numbers.Integral) and shares >= 1):
        raise ValueError(f"shares must be an integer >= 1 (the parties adding noise); got {shares!r}")
    return noise_multiplier * clip / math.sqrt(shares)
