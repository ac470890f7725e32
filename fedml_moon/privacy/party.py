"""A party's side of `privacy_args`: from its upload to the one vector it adds to the round's sum.

The server says what to add in a `Plan` (the algorithm's `summed` fields, the party's weight ratio,
DP's clipping norm and the party's share of the noise); the party turns its upload into its addends
(`privacy.sums.contribution`), clips their concatenation to the norm (DP-FedAvg's flat clipping,
McMahan et al. 2018, Algorithm 1), adds its noise share when secure aggregation hides the sum from
the server, and appends its weighted training metrics. Secure aggregation then masks that vector.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from fedml_moon.privacy.dp import clip_to_norm, gaussian_noise
from fedml_moon.privacy.sums import KINDS, Entry, contribution, flatten, layout

log = logging.getLogger(__name__)


class PrivacyError(ValueError):
    """A party cannot add its upload to the round's sum (non-finite values, a plan that does not fit)."""


@dataclass(frozen=True)
class Plan:
    """What one party adds this round: `summed` (field -> "update" | "sum"), its weight `ratio` in
    (0, 1], DP's `clip` (None: no clipping) and `noise_std` (its own share; 0: none), and `secure`
    (whether the vector is masked)."""

    summed: dict[str, str] = field(default_factory=dict)
    ratio: float = 1.0
    clip: float | None = None
    noise_std: float = 0.0
    secure: bool = False
    metric_ratio: float = 1.0  # the party's samples over the largest party's: its metrics' weight

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> Plan:
        """A plan as received (checked: kinds known, ratio in (0, 1], clip > 0, noise_std >= 0)."""
        plan = cls(
            dict(raw["summed"]),
            float(raw["ratio"]),
            raw["clip"],
            float(raw["noise_std"]),
            bool(raw["secure"]),
            float(raw["metric_ratio"]),
        )
        if not plan.summed or any(kind not in KINDS for kind in plan.summed.values()):
            raise PrivacyError(f"a plan's summed fields {plan.summed} are not field -> one of {KINDS}")
        if not (0 < plan.ratio <= 1 and 0 < plan.metric_ratio <= 1) or not 0 <= plan.noise_std < math.inf:
            raise PrivacyError(f"a plan's ratio {plan.ratio} or noise_std {plan.noise_std} is out of range")
        if plan.clip is not None and not (isinstance(plan.clip, (int, float)) and plan.clip > 0):
            raise PrivacyError(f"a plan's clip {plan.clip!r} is not a norm > 0")
        return plan


@dataclass
class PartyVector:
    """The vector one party adds, with the layout that reads it back."""

    vector: torch.Tensor  # float64 [L]
    entries: list[Entry]
    metric_names: list[str]
    norm: float = 0.0  # the fields' L2 norm before clipping


def party_vector(upload: Mapping, received: Mapping, plan: Plan) -> PartyVector:
    """The party's addends, clipped and noised as `plan` says, then its metrics times its sample ratio."""
    fields = contribution(upload, received, plan.summed, plan.ratio)
    entries = layout(fields)
    vector = flatten(fields, {}, plan.ratio)
    if not torch.isfinite(vector).all():
        raise PrivacyError("the upload holds NaN or Inf: the party cannot add it to the round's sum")
    norm = float(vector.norm())
    if plan.clip is not None:
        vector, norm = clip_to_norm(vector, float(plan.clip))
    if plan.noise_std > 0:
        vector = vector + gaussian_noise(vector, plan.noise_std)
    metrics = {k: float(v) for k, v in (upload.get("metrics") or {}).items() if math.isfinite(float(v))}
    tail = torch.tensor([plan.metric_ratio * metrics[k] for k in sorted(metrics)], dtype=torch.float64)
    return PartyVector(torch.cat([vector, tail]), entries, sorted(metrics), norm)


def warn_out_of_range(vector: torch.Tensor, clip: float, party: int) -> int:
    """How many values lie outside the fixed-point range [-clip, clip]; they are clipped to it, and a
    warning says so (raise privacy_args.secagg_clip, or lower the learning rate)."""
    count = int((vector.abs() > clip).sum())
    if count:
        log.warning(
            "party %d: %d of %d values lie outside [-%g, %g] and are clipped to it before masking "
            "(privacy_args.secagg_clip)",
            party,
            count,
            vector.numel(),
            clip,
            clip,
        )
    return count
