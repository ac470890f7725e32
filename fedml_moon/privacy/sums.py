"""The sum form of a round: what each party adds to the round's sum, and the sum read back.

Under `privacy_args` the server never combines uploads one by one: it learns one sum (secure
aggregation gives it nothing else), and the server algorithm's `aggregate_sums` turns that into the
new global state. What a party adds is fixed by the server algorithm's `summed` declaration, field by
field of its upload:

- "update": r * (upload[field] - received[field]) per tensor, r the party's weight ratio
  (its `sum_weight` over the largest party's, so that every r <= 1 keeps the fixed-point range);
  the sum divided by the sum of the ratios is the weighted mean update (MOON Algorithm 1, line 7,
  written as an update).
- "sum": upload[field] as it is (SCAFFOLD's delta_c, FedSSC's prototype and class counts).

The party's training metrics (loss, ce, l_con, ...) are added as r * value, so the round's record
keeps their weighted mean. Everything is float64 and flattened into one vector in a fixed layout.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

UPDATE, SUM = "update", "sum"
KINDS = (UPDATE, SUM)
Entry = tuple[str, str, tuple[int, ...]]  # (field, key within it or "", shape)


@dataclass
class Sums:
    """A round's sums: `weight` = the sum of the ratios (or DP's fixed denominator), `count` = parties
    summed, `fields` shaped as the uploads' fields (dicts of tensors or tensors, float64), `metrics`
    = the weighted mean of each training metric over the parties summed."""

    weight: float
    count: int
    fields: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)


def contribution(
    upload: Mapping,
    received: Mapping,
    summed: Mapping[str, str],
    ratio: float,
    skip: Collection[str] = (),
) -> dict:
    """One party's addends (float64), field by field as `summed` declares (module docstring); entries
    named in `skip` (integer counters: never summed) are left out of every field."""
    out: dict[str, Any] = {}
    for name, kind in summed.items():
        if kind not in KINDS:
            raise ValueError(f"summed field {name!r}: kind {kind!r} is not one of {KINDS}")
        value = upload[name]
        if kind == UPDATE:
            base = received[name]
            out[name] = {
                k: (t.detach().double() - base[k].detach().double()) * ratio
                for k, t in value.items()
                if k not in skip
            }
        elif isinstance(value, Mapping):
            out[name] = {k: t.detach().double() for k, t in value.items() if k not in skip}
        else:
            out[name] = value.detach().double()
    return out


def layout(fields: Mapping[str, Any]) -> list[Entry]:
    """The order and shapes in which `fields` flatten (sorted keys inside a field)."""
    entries: list[Entry] = []
    for name in sorted(fields):
        value = fields[name]
        if isinstance(value, Mapping):
            entries += [(name, k, tuple(value[k].shape)) for k in sorted(value)]
        else:
            entries.append((name, "", tuple(value.shape)))
    return entries


def flatten(fields: Mapping[str, Any], metrics: Mapping[str, float], ratio: float) -> torch.Tensor:
    """One float64 vector: the fields in `layout` order, then r * each metric (sorted names)."""
    parts = [
        (fields[name][key] if key else fields[name]).reshape(-1).double() for name, key, _ in layout(fields)
    ]
    parts.append(torch.tensor([ratio * float(metrics[k]) for k in sorted(metrics)], dtype=torch.float64))
    return torch.cat(parts)


def unflatten(vector: torch.Tensor, entries: list[Entry], metric_names: list[str]) -> tuple[dict, dict]:
    """Back from `flatten`'s vector (or a sum of such vectors): (fields, metrics)."""
    sizes = [int(torch.Size(shape).numel()) for _, _, shape in entries]
    expected = sum(sizes) + len(metric_names)
    if vector.numel() != expected:
        raise ValueError(f"a summed vector of {vector.numel()} values does not fit a layout of {expected}")
    fields: dict[str, Any] = {}
    offset = 0
    for (name, key, shape), size in zip(entries, sizes, strict=True):
        value = vector[offset : offset + size].reshape(shape)
        offset += size
        if key:
            fields.setdefault(name, {})[key] = value
        else:
            fields[name] = value
    metrics = {k: float(v) for k, v in zip(sorted(metric_names), vector[offset:].tolist(), strict=True)}
    return fields, metrics


def apply_mean_update(global_state: Mapping[str, torch.Tensor], total: Mapping, weight: float) -> dict:
    """global + total / weight for the keys of `total`, in each entry's dtype (integer buffers
    rounded); the entries `total` lacks are left out."""
    out = {}
    for key, summed in total.items():
        old = global_state[key]
        new = old.double() + summed / weight
        out[key] = new.to(old.dtype) if old.is_floating_point() else new.round().to(old.dtype)
    return out
