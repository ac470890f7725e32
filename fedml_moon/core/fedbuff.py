"""Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022, Algorithm 1), pure.

The server's side, knowing no model or transport (the simulated clock that says when updates arrive
is `core/sim_clock.py`):

- `discount` and `Buffer`: the staleness discount s(tau) and the buffer of discounted updates. The
  server applies x <- x + eta_g * sum_i r_i s(tau_i) Delta_i / sum_i r_i once it holds K updates,
  r_i = 1 (the paper's 1/K) or the party's sample weight (`server_args.buffer_weights`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fedml_moon.core.buffering import STALENESS


def discount(kind: str, staleness: int, exponent: float = 0.5) -> float:
    """s(tau): sqrt 1 / sqrt(1 + tau) (the paper's), polynomial (1 + tau)^-exponent, constant 1."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0; got {staleness}")
    if kind == "sqrt":
        return 1.0 / math.sqrt(1.0 + staleness)
    if kind == "polynomial":
        return (1.0 + staleness) ** -float(exponent)
    if kind == "constant":
        return 1.0
    raise ValueError(f"unknown staleness discount {kind!r}; choose one of {', '.join(STALENESS)}")


def stat_shift(sent: dict, current: dict, keys: list[str], scale: float) -> dict:
    """scale * (sent - current) for the running statistics `keys` (float64): added to a party's
    r s (stat - sent), it measures the party's statistics against the current global model instead
    (`restate`)."""
    return {k: (sent[k].double() - current[k].double()) * scale for k in keys if k in sent}


def restate(model_sum: dict, weight: float, shifts: list[tuple[int, float, dict]]) -> None:
    """Running statistics (BatchNorm's) of a buffer's model sum, measured against the current global
    model x rather than each party's x_sent: with R = sum r_i, adds weight / R * sum r_i s_i (x_sent_i -
    x) to `model_sum` (whose entries / `weight` are sum r_i s_i (stat_i - x_sent_i) / R), so that the
    applied statistic is x + sum r_i s_i (stat_i - x) / R = (1 - sum r_i s_i / R) x + sum r_i s_i
    stat_i / R: a convex combination, a variance stays >= 0 however stale. With every tau = 0
    (x_sent = x) it is Algorithm 1's step itself."""
    total = sum(r for _, r, _ in shifts)
    if total <= 0:
        return
    for _, _, tree in shifts:
        for key, value in tree.items():
            if key in model_sum:
                model_sum[key] = model_sum[key] + value * (weight / total)


def add_tree(total: Any, part: Any, scale: float = 1.0) -> Any:
    """total + scale * part for trees (dicts) of float64 tensors; `total` None starts one."""
    if isinstance(part, dict):
        total = {} if total is None else total
        return {k: add_tree(total.get(k), v, scale) for k, v in part.items()}
    return part * scale if total is None else total.add_(part, alpha=scale)


@dataclass
class Buffer:
    """The server's buffer: `add` each arriving contribution (already r_i * Delta_i per "update" field),
    discounted; `weight` sums the r_i undiscounted, the denominator of the paper's 1/K."""

    fields: dict[str, Any] | None = None
    weight: float = 0.0
    staleness: list[int] = field(default_factory=list)
    kept: list[tuple[int, Any]] = field(default_factory=list)  # (party, what the record keeps of it)
    shifts: list[tuple[int, float, dict]] = field(default_factory=list)  # (party, r_i, its `stat_shift`)

    def add(
        self, addends: dict[str, Any], ratio: float, staleness: int, keep: Any = None, party: int = 0
    ) -> None:
        """Add one party's addends; `ratio`: its r_i (sums the weight), `staleness`: its tau."""
        self.fields = add_tree(self.fields, addends)
        self.weight += ratio
        self.staleness.append(int(staleness))
        self.kept.append((party, keep))

    def remove(self, party: int, ratio: float = 1.0) -> None:
        """Take `party`'s update (added with `ratio` and no addends: a secure sum's placeholder) out."""
        i = next(i for i, (q, _) in enumerate(self.kept) if q == party)
        del self.kept[i], self.staleness[i]
        self.weight -= ratio
        self.shifts = [shift for shift in self.shifts if shift[0] != party]

    def __len__(self) -> int:
        return len(self.staleness)

    def state(self) -> dict[str, Any]:
        shifts = [list(shift) for shift in self.shifts]
        return {
            "fields": self.fields,
            "weight": self.weight,
            "staleness": self.staleness,
            "kept": self.kept,
            "shifts": shifts,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Buffer:
        kept = [(int(p), keep) for p, keep in state["kept"]]
        shifts = [(int(p), float(r), tree) for p, r, tree in state.get("shifts", [])]
        return cls(
            state["fields"], float(state["weight"]), [int(s) for s in state["staleness"]], kept, shifts
        )

    def stats(self) -> dict[str, float]:
        """The buffer's staleness: mean and max over its updates."""
        s = self.staleness
        return {"staleness_mean": sum(s) / len(s) if s else 0.0, "staleness_max": max(s, default=0)}
