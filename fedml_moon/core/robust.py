"""Byzantine-robust aggregation of uploads on the server (`server_args.robust_aggregation`). Pure PyTorch.

A `RobustMean` stands wherever a server algorithm averages what parties upload (models, LG-FedAvg's
global layers, SCAFFOLD's control-variate changes, FedSSC's class prototypes); the algorithm calls it
and never knows which rule runs.

- `none`: the sample-weighted average, bitwise (`core.aggregation.weighted_average`).
- `median`: the coordinate-wise median (Yin et al., ICML 2018, "Byzantine-robust distributed learning:
  towards optimal statistical rates", Algorithm 1 option I); unweighted; with an even count the mean
  of the two middle values.
- `trimmed_mean`: the coordinate-wise beta-trimmed mean (same paper, option II): per coordinate the
  b = floor(beta n) largest and b smallest values are dropped (b >= 1 when beta > 0 and n >= 3) and
  the rest averaged; unweighted.
- `krum`: Krum / Multi-Krum (Blanchard et al., NeurIPS 2017, "Machine learning with adversaries:
  Byzantine tolerant gradient descent"): score(i) = the sum of the squared distances from upload i
  to its n - f - 2 nearest other uploads; Krum takes the upload of lowest score, Multi-Krum
  (m > 1) the sample-weighted average of the m lowest (m at most n - f). Krum needs n > 2f + 2: with
  fewer uploads the coordinate-wise median stands in, and a warning says so.
- `norm_clip`: norm-difference clipping (Sun et al., 2019, "Can you really backdoor federated
  learning?"): each update u_i = w_i - w (w: the current global state, or zero where there is none)
  is scaled to norm at most M, u_i * min(1, M / ||u_i||), and w plus the sample-weighted average of
  the clipped updates is the result. M = `clip_norm`, or the median of the round's update norms.

Only floating-point entries go through a rule. Integer entries (BatchNorm's num_batches_tracked)
take the coordinate-wise median of the uploads under every rule but `none`, rounded back to their
dtype, so one upload's counter cannot move them (the weighted average under `none`). Norms and
distances run over every floating-point entry of an upload (BatchNorm's running statistics included).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fedml_moon.core.aggregation import weighted_average
from fedml_moon.core.choices import RULES

State = Mapping[str, torch.Tensor]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RobustOptions:
    """The rule and its parameters (`server_args`: robust_aggregation, trim_ratio, krum_byzantine,
    krum_select, clip_norm)."""

    rule: str = "none"
    trim_ratio: float = 0.1
    krum_byzantine: int = 1
    krum_select: int = 1
    clip_norm: float | None = None


def coordinate_median(x: torch.Tensor) -> torch.Tensor:
    """Median over dim 0 of x [n, ...] (Yin et al. 2018, option I); even n: mean of the middle two."""
    n = x.shape[0]
    ordered = x.sort(dim=0).values
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trim_count(n: int, beta: float) -> int:
    """Values dropped at each end: floor(beta n), at least 1 when beta > 0 and n >= 3, leaving >= 1."""
    if beta <= 0 or n < 3:
        return 0
    return min(max(1, math.floor(beta * n + 1e-9)), (n - 1) // 2)


def trimmed_mean(x: torch.Tensor, beta: float) -> torch.Tensor:
    """Coordinate-wise beta-trimmed mean over dim 0 of x [n, ...] (Yin et al. 2018, option II)."""
    n = x.shape[0]
    b = trim_count(n, beta)
    return x.sort(dim=0).values[b : n - b].mean(dim=0)


def pairwise_sq_distances(states: Sequence[State], keys: Sequence[str]) -> torch.Tensor:
    """[n, n] squared Euclidean distances between the uploads over the entries `keys` (float64)."""
    n = len(states)
    out = torch.zeros(n, n, dtype=torch.float64)
    for key in keys:
        x = torch.stack([s[key].detach().to("cpu", torch.float64).flatten() for s in states])
        for i in range(n):
            out[i] += (x - x[i]).square().sum(dim=1)
    return out


def krum_scores(sq: torch.Tensor, f: int) -> torch.Tensor:
    """score(i) = sum of the n - f - 2 smallest squared distances from i to the others (Blanchard et
    al. 2017, Krum's score); `sq` [n, n] with n > 2f + 2."""
    n = sq.shape[0]
    others = sq + torch.diag(torch.full((n,), math.inf, dtype=sq.dtype))
    return others.sort(dim=1).values[:, : n - f - 2].sum(dim=1)


def krum_select(sq: torch.Tensor, f: int, m: int) -> list[int]:
    """Indices of the m uploads of lowest Krum score (m = 1: Krum; m > 1: Multi-Krum), lowest first;
    ties go to the lower index."""
    order = torch.argsort(krum_scores(sq, f), stable=True)
    return sorted(order[:m].tolist())


def clip_scales(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """min(1, M / ||u_i||) per update (Sun et al. 2019's norm-difference clipping); 1 for a zero update."""
    return torch.where(norms > bound, bound / norms.clamp(min=1e-300), torch.ones_like(norms))


def _stack(states: Sequence[State], key: str) -> torch.Tensor:
    return torch.stack([s[key].detach().to("cpu", torch.float64) for s in states])


def _weighted(rows: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    return torch.tensordot(w / w.sum(), rows, dims=1)


class RobustMean:
    """`mean(states, weights, reference)`: what an algorithm's server step uses in place of the weighted
    average of uploads. `reference` is the state the uploads are updates of (the current global
    state, for `norm_clip`); None: the uploads are updates themselves (their reference is zero)."""

    def __init__(self, options: RobustOptions | None = None) -> None:
        self.options = options or RobustOptions()
        if self.options.rule not in RULES:
            raise ValueError(f"unknown robust aggregation {self.options.rule!r}; choose one of {RULES}")
        self.rule = self.options.rule
        self._warned: set[int] = set()

    def __call__(
        self, states: Sequence[State], weights: Sequence[float], reference: State | None = None
    ) -> OrderedDict:
        """The rule's combination of `states` (None of them changed), with `weights` (sample counts)."""
        if self.rule == "none":
            return weighted_average(states, weights)
        floats = self._robust(states, weights, reference)
        return self._assemble(states, weights, floats, 1.0)

    def total(self, states: Sequence[State], reference: State | None = None) -> OrderedDict:
        """sum_S state_i: for `none` the plain sum, otherwise |S| times the rule's equal-weight mean
        (SCAFFOLD's c update, sum_S delta c_i / N = |S|/N mean_S delta c_i)."""
        if self.rule == "none":
            return OrderedDict((k, sum(s[k] for s in states)) for k in states[0])
        ones = [1.0] * len(states)
        floats = self._robust(states, ones, reference)
        return self._assemble(states, ones, floats, float(len(states)))

    def rows(self, x: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
        """The equal-weight mean of the rows x[0], ..., x[n-1] under the rule (`none`: x.mean(dim=0))."""
        if self.rule == "none":
            return x.mean(dim=0)
        ref = None if reference is None else {"x": reference}
        return self([{"x": row} for row in x], [1.0] * x.shape[0], ref)["x"]

    def _assemble(
        self, states: Sequence[State], weights: Sequence[float], floats: dict, factor: float
    ) -> OrderedDict:
        """Float entries from the rule, integer entries from the coordinate-wise median (rounded),
        both times `factor` (|S| for `total`), in the uploads' dtype and device."""
        out: OrderedDict = OrderedDict()
        for key, first in states[0].items():
            value = floats[key] if key in floats else coordinate_median(_stack(states, key)).round()
            out[key] = (value * factor).to(first.device, first.dtype)
        return out

    def _robust(
        self, states: Sequence[State], weights: Sequence[float], reference: State | None
    ) -> dict[str, torch.Tensor]:
        """{key: float64 result} for every floating-point entry, under the rule."""
        if not states or len(states) != len(weights) or float(sum(weights)) <= 0:
            raise ValueError("need one weight per state, at least one state, and weights summing to > 0")
        keys = [k for k, v in states[0].items() if v.is_floating_point()]
        rule, opts = self.rule, self.options
        if rule == "krum" and len(states) <= 2 * opts.krum_byzantine + 2:
            self._say_krum_falls_back(len(states))
            rule = "median"
        if rule == "median":
            return {k: coordinate_median(_stack(states, k)) for k in keys}
        if rule == "trimmed_mean":
            return {k: trimmed_mean(_stack(states, k), opts.trim_ratio) for k in keys}
        if rule == "krum":
            return self._krum(states, weights, keys)
        return self._norm_clip(states, weights, reference, keys)

    def _krum(self, states: Sequence[State], weights: Sequence[float], keys: list[str]) -> dict:
        """Krum (m = 1) or Multi-Krum: the sample-weighted average of the m uploads of lowest score."""
        f, n = self.options.krum_byzantine, len(states)
        chosen = krum_select(pairwise_sq_distances(states, keys), f, min(self.options.krum_select, n - f))
        log.debug("krum: uploads %s of %d chosen", chosen, n)
        picked, w = [states[i] for i in chosen], [weights[i] for i in chosen]
        return {k: _weighted(_stack(picked, k), w) for k in keys}

    def _norm_clip(
        self, states: Sequence[State], weights: Sequence[float], reference: State | None, keys: list[str]
    ) -> dict:
        """w + sum_i weights_i / sum(weights) * min(1, M / ||u_i||) u_i, u_i = w_i - w."""
        ref = {k: _reference(reference, k, states[0][k]) for k in keys}
        updates = {k: _stack(states, k) - ref[k] for k in keys}
        n = len(states)
        norms = torch.zeros(n, dtype=torch.float64)
        for u in updates.values():
            norms += u.reshape(n, -1).square().sum(dim=1)
        norms = norms.sqrt()
        bound = (
            self.options.clip_norm if self.options.clip_norm is not None else float(coordinate_median(norms))
        )
        scales = clip_scales(norms, bound)
        log.debug("norm_clip: bound %.4g, update norms %s", bound, [round(float(v), 4) for v in norms])
        out = {}
        for k, u in updates.items():
            scaled = u * scales.reshape(-1, *[1] * (u.dim() - 1))
            out[k] = ref[k] + _weighted(scaled, weights)
        return out

    def _say_krum_falls_back(self, n: int) -> None:
        if n in self._warned:
            return
        self._warned.add(n)
        f = self.options.krum_byzantine
        log.warning(
            "krum needs more than 2 * server_args.krum_byzantine + 2 = %d uploads and got %d: the "
            "coordinate-wise median stands in for these (said once per upload count)",
            2 * f + 2,
            n,
        )


def _reference(reference: State | None, key: str, like: torch.Tensor) -> torch.Tensor:
    if reference is None:
        return torch.zeros(like.shape, dtype=torch.float64)
    return reference[key].detach().to("cpu", torch.float64)
