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
from typing import Any

import torch

from fedml_moon.privacy.dp import clip_to_norm, gaussian_noise, noise_std
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.sums import KINDS, UPDATE, Entry, contribution, flatten, layout

log = logging.getLogger(__name__)


class PrivacyError(ValueError):
    """A party cannot add its upload to the round's sum (non-finite values, a plan that does not fit)."""


CLEAR = "clear"  # where a vector's entries summed outside its clipped part travel


@dataclass(frozen=True)
class Plan:
    """What one party adds this round: `summed` (field -> "update" | "sum"), its weight `ratio` in
    (0, 1], DP's `clip` (None: no clipping) and `noise_std` (its own share; 0: none), `secure`
    (whether the vector is masked), the model entries `left_out` of every sum (integer counters) and
    those summed in the `clear`, outside the clipped and noised part (BatchNorm statistics under
    `privacy_args.dp_buffers: average`), and `min_sum`: the fewest parties whose sum its noise share
    was sized for (secure aggregation with DP; below it the party reveals no share)."""

    summed: dict[str, str] = field(default_factory=dict)
    ratio: float = 1.0
    clip: float | None = None
    noise_std: float = 0.0
    secure: bool = False
    metric_ratio: float = 1.0  # the party's samples over the largest party's: its metrics' weight
    left_out: tuple[str, ...] = ()
    clear: tuple[str, ...] = ()
    min_sum: int = 0
    metrics: tuple[str, ...] = ()  # the training metrics the vector ends with, in order (the server's)
    discount: float = 1.0  # buffered aggregation: s(tau) of its "update" fields, after clipping

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> Plan:
        """A plan as received (checked: kinds known, ratio in (0, 1], clip > 0, noise_std >= 0, names
        of entries, min_sum an integer >= 0)."""
        names = [raw["left_out"], raw["clear"], raw["metrics"]]
        if not all(isinstance(n, (list, tuple)) and all(isinstance(k, str) for k in n) for n in names):
            raise PrivacyError("a plan's left_out, clear and metrics are not lists of names")
        if type(raw["min_sum"]) is not int or raw["min_sum"] < 0:
            raise PrivacyError(f"a plan's min_sum {raw['min_sum']!r} is not an integer >= 0")
        plan = cls(
            dict(raw["summed"]),
            float(raw["ratio"]),
            raw["clip"],
            float(raw["noise_std"]),
            bool(raw["secure"]),
            float(raw["metric_ratio"]),
            tuple(raw["left_out"]),
            tuple(raw["clear"]),
            raw["min_sum"],
            tuple(raw["metrics"]),
            float(raw["discount"]),
        )
        if not plan.summed or any(kind not in KINDS for kind in plan.summed.values()):
            raise PrivacyError(f"a plan's summed fields {plan.summed} are not field -> one of {KINDS}")
        if not (0 < plan.ratio <= 1 and 0 < plan.metric_ratio <= 1) or not 0 <= plan.noise_std < math.inf:
            raise PrivacyError(f"a plan's ratio {plan.ratio} or noise_std {plan.noise_std} is out of range")
        if not 0 < plan.discount <= 1:
            raise PrivacyError(f"a plan's discount {plan.discount} is not in (0, 1]")
        if plan.clip is not None and not (isinstance(plan.clip, (int, float)) and plan.clip > 0):
            raise PrivacyError(f"a plan's clip {plan.clip!r} is not a norm > 0")
        return plan


@dataclass
class PartyVector:
    """The vector one party adds, with the layout that reads it back."""

    vector: torch.Tensor  # float64 [L]
    entries: list[Entry]
    metric_names: list[str]
    norm: float = 0.0  # the clipped part's L2 norm before clipping


def plan_problem(
    plan: Plan, options: PrivacyArgs, per_round: int, discount: float = 1.0, exact: bool = False
) -> str | None:
    """Why a plan the server sent is not what the run's `privacy_args` ask of this party (its own copy
    of the shared settings): another clipping norm, another noise share than sigma C / sqrt(min_sum),
    a min_sum outside [1, per_round] (client_num_per_round; a buffered run's buffer_size), other than
    per_round with `exact` (a buffer's sum is always of its K parties), or another staleness discount
    than `discount` (1 in a synchronous round); None when it is."""
    if plan.secure != options.secure_aggregation or plan.clip != options.dp_clip_norm:
        return f"the plan's clip {plan.clip} or secure {plan.secure} is not the run's privacy_args"
    if not math.isclose(plan.discount, discount, rel_tol=1e-12):
        return f"the plan's discount {plan.discount} is not {discount} (the run's staleness rule for it)"
    if not (options.dp and options.secure_aggregation):
        return None if plan.noise_std == 0 else f"the plan asks for noise {plan.noise_std} the server adds"
    if not 1 <= plan.min_sum <= per_round:
        return f"the plan's min_sum {plan.min_sum} is not in [1, {per_round}] (the parties a round sums)"
    if exact and plan.min_sum != per_round:
        return f"the plan's noise share is sized for {plan.min_sum} parties, not the buffer's {per_round}"
    want = noise_std(options.dp_clip_norm, options.dp_noise_multiplier, plan.min_sum)
    if not math.isclose(plan.noise_std, want, rel_tol=1e-9):
        return f"the plan's noise share {plan.noise_std} is not sigma C / sqrt({plan.min_sum}) = {want}"
    return None


def split(fields: Mapping[str, Any], plan: Plan) -> tuple[dict, dict]:
    """(the clipped part, the clear part) of a party's addends (or of a spec of them): entries named in
    `plan.left_out` dropped, the model's entries named in `plan.clear` under CLEAR."""
    kept = {
        f: {k: v for k, v in val.items() if k not in plan.left_out} if isinstance(val, Mapping) else val
        for f, val in fields.items()
    }
    model = kept.get("model")
    if not plan.clear or not isinstance(model, Mapping):
        return kept, {}
    clear = {k: v for k, v in model.items() if k in plan.clear}
    return {**kept, "model": {k: v for k, v in model.items() if k not in clear}}, {CLEAR: clear}


def plan_layout(fields: Mapping[str, Any], plan: Plan) -> list[Entry]:
    """The entries of a party's vector in order (the clipped part, then the clear part), from its
    addends or from the upload spec's summed fields: what reads the round's sum back."""
    private, clear = split(fields, plan)
    return layout(private) + layout(clear)


def party_vector(upload: Mapping, received: Mapping, plan: Plan) -> PartyVector:
    """The party's addends, clipped, discounted and noised as `plan` says (the clear part as it is,
    discounted), then its metrics times its sample ratio."""
    fields = contribution(upload, received, plan.summed, plan.ratio, plan.left_out)
    private, clear = split(fields, plan)
    vector, rest = flatten(private, {}, plan.ratio), flatten(clear, {}, plan.ratio)
    if not (torch.isfinite(vector).all() and torch.isfinite(rest).all()):
        raise PrivacyError("the upload holds NaN or Inf: the party cannot add it to the round's sum")
    norm = float(vector.norm())
    if plan.clip is not None:
        vector, norm = clip_to_norm(vector, float(plan.clip))
    if plan.discount != 1.0:
        vector = discounted(vector, layout(private), plan.summed, plan.discount)
        rest = discounted(rest, layout(clear), {CLEAR: UPDATE}, plan.discount)
    if plan.noise_std > 0:
        vector = vector + gaussian_noise(vector, plan.noise_std)
    tail = torch.tensor(
        [plan.metric_ratio * v for v in metric_values(upload, plan.metrics)], dtype=torch.float64
    )
    return PartyVector(
        torch.cat([vector, rest, tail]), layout(private) + layout(clear), list(plan.metrics), norm
    )


def discounted(
    vector: torch.Tensor, entries: list[Entry], summed: Mapping[str, str], s: float
) -> torch.Tensor:
    """`vector` (laid out as `entries`) with the entries of "update" fields times the staleness
    discount `s` (FedBuff); "sum" fields (FedSSC's prototypes) as they are."""
    scale, offset = torch.ones_like(vector), 0
    for name, _, shape in entries:
        size = int(torch.Size(shape).numel())
        if summed.get(name) == UPDATE:
            scale[offset : offset + size] = s
        offset += size
    return vector * scale


def metric_values(upload: Mapping, names: tuple[str, ...]) -> list[float]:
    """The upload's training metrics `names` (the round's, from the server's plan), in order; a party
    whose metrics lack one or hold a value that is not a finite number cannot add to the sum."""
    metrics = upload.get("metrics") or {}
    values = [metrics.get(name) for name in names]
    bad = [n for n, v in zip(names, values, strict=True) if not _finite_number(v)]
    if bad:
        raise PrivacyError(f"the upload's metrics {bad} are missing or not finite: it cannot add to the sum")
    return [float(v) for v in values]


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= 1e15


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
