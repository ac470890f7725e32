"""Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022, Algorithm 1), pure.

Three pieces, none of which knows a model or a transport:

- `party_durations`: each party's simulated seconds per local round (`train_args.party_speed`),
  drawn once per party from the run's seed, or read from a file of measured times;
- `SimClock`: an event queue in simulated time; events at the same instant come out together,
  in party-id order, so a run is deterministic for its seed;
- `discount` and `Buffer`: the staleness discount s(tau) and the buffer of discounted updates. The
  server applies x <- x + eta_g * sum_i r_i s(tau_i) Delta_i / sum_i r_i once it holds K updates,
  r_i = 1 (the paper's 1/K) or the party's sample weight (`server_args.buffer_weights`).
"""

from __future__ import annotations

import csv
import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedml_moon.core.buffering import PARTY_SPEEDS, STALENESS
from fedml_moon.core.seeds import rng


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


def read_times(path: str | Path, n_parties: int) -> list[list[float]]:
    """A file of measured local-round times: CSV rows `party,seconds` (lines starting with # and a
    header row before the first time are allowed); a
    party's successive rounds take its listed times in order, cycling. Every party 0..n-1 needs one."""
    times: list[list[float]] = [[] for _ in range(n_parties)]
    first = True  # the first row that is not a comment may be a header
    with open(path, newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].strip().startswith("#"):
                continue
            header, first = first and not row[0].strip().isdigit(), False
            if header:
                continue
            try:
                party, seconds = int(row[0]), float(row[1])
            except (ValueError, IndexError):
                raise ValueError(
                    f"{path}, line {line}: write party,seconds (e.g. 3,1.5); got {row}"
                ) from None
            if not 0 <= party < n_parties or not seconds >= 0 or math.isinf(seconds):
                raise ValueError(
                    f"{path}, line {line}: party in [0, {n_parties}) and seconds >= 0; got {row}"
                )
            times[party].append(seconds)
    missing = [p for p, t in enumerate(times) if not t]
    if missing:
        raise ValueError(f"{path}: no time for parties {missing[:10]} (each of the {n_parties} needs one)")
    return times


def party_durations(
    kind: str, n_parties: int, seed: int, sigma: float = 1.0, path: str | Path | None = None
) -> list[list[float]]:
    """Each party's simulated seconds per local round (a list, cycled over its rounds): constant 1;
    lognormal exp(sigma z); halfnormal sigma |z| (the paper's delays), z ~ N(0, 1) drawn once per
    party on the run seed's "party_speed" stream; file: `read_times(path)`."""
    if kind == "file":
        if path is None:
            raise ValueError("party_speed file needs train_args.party_speed_file")
        return read_times(path, n_parties)
    z = rng(seed, "party_speed").standard_normal(n_parties)
    if kind == "constant":
        return [[1.0] for _ in range(n_parties)]
    if kind == "lognormal":
        return [[math.exp(sigma * float(v))] for v in z]
    if kind == "halfnormal":
        return [[sigma * abs(float(v))] for v in z]
    raise ValueError(f"unknown party_speed {kind!r}; choose one of {', '.join(PARTY_SPEEDS)}")


class SimClock:
    """Simulated time: `start(party, now)` schedules the end of the party's next local round,
    `next_instant()` pops every event of the earliest time (party-id order)."""

    def __init__(self, durations: list[list[float]]) -> None:
        self.durations = durations
        self.jobs = [0] * len(durations)  # rounds started per party (a file's times cycle)
        self.events: list[tuple[float, int]] = []
        self.now = 0.0

    def duration(self, party: int) -> float:
        """The seconds `party`'s next local round takes (advances its count)."""
        times = self.durations[party]
        seconds = times[self.jobs[party] % len(times)]
        self.jobs[party] += 1
        return seconds

    def sync_round(self, parties: list[int]) -> float:
        """A synchronous round of `parties`: it ends when the slowest ends; returns the new time."""
        self.now += max((self.duration(p) for p in parties), default=0.0)
        return self.now

    def start(self, party: int) -> float:
        """Schedule `party`'s round from now; returns when it ends."""
        end = self.now + self.duration(party)
        heapq.heappush(self.events, (end, party))
        return end

    def state(self) -> dict[str, Any]:
        """The clock as JSON values: the time, each party's rounds begun, the events to come."""
        return {"now": self.now, "jobs": list(self.jobs), "events": [list(e) for e in sorted(self.events)]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.now, self.jobs = float(state["now"]), [int(j) for j in state["jobs"]]
        self.events = [(float(t), int(p)) for t, p in state["events"]]
        heapq.heapify(self.events)

    def peek(self) -> tuple[float, list[int]] | None:
        """(time, parties) of the earliest events without taking them; None when none is scheduled."""
        if not self.events:
            return None
        when = self.events[0][0]
        return when, sorted(p for t, p in self.events if t == when)

    def cancel(self, parties: set[int]) -> None:
        """Drop the scheduled ends of `parties` (their silo is gone: their updates never come)."""
        self.events = [e for e in self.events if e[1] not in parties]
        heapq.heapify(self.events)

    def next_instant(self) -> tuple[float, list[int]]:
        """(time, parties) of the earliest events, parties sorted by id; the clock moves to it."""
        if not self.events:
            raise RuntimeError("no party is training: the simulated clock has nothing to wait for")
        when = self.events[0][0]
        parties = []
        while self.events and self.events[0][0] == when:
            parties.append(heapq.heappop(self.events)[1])
        self.now = when
        return when, sorted(parties)


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
