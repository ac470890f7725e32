"""The simulated clock of the simulations (standalone, MPI): how long each party's local round takes,
and when its update arrives. Pure Python; it knows no model.

A local round's seconds are drawn from a law (`train_args.party_speed`), as FLSim's and the FedBuff
paper's simulations draw them:

- constant: `mean`;
- lognormal: mean x exp(sigma z), z ~ N(0, 1) (mean is its median);
- halfnormal: low + sigma |z| (FLSim's per-user half-normal: min + HalfNormal(sd));
- exponential: an exponential law of mean `mean` (FLSim: rate 1 / mean);
- uniform: uniform on [low, 2 mean - low] (FLSim's, of mean `mean`);
- file: the measured times of a CSV file, each party's in turn (`read_times`).

Drawn once per party for the whole run (`draw: party`, the default), or afresh for every local round
(`draw: round`, FLSim's), each draw on the run seed's "party_speed" stream keyed by the party and its
round count, so it does not depend on the order the server asks in. `per_example`: the draw is the
seconds per training example, times the party's examples (FLSim's per-example law). `bandwidth_bps`:
the model's bytes down and the update's bytes up, at that many bits per second, are added.

`SimClock` is an event queue in simulated time: events at the same instant come out together, in
party-id order, so a run is deterministic for its seed.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedml_moon.core.buffering import PARTY_SPEEDS
from fedml_moon.core.presence import Arrivals, Presence, every_party, party_rows
from fedml_moon.core.seeds import rng


def read_times(path: str | Path, n_parties: int) -> list[list[float]]:
    """A file of measured local-round times: CSV rows `party,seconds` (`core.presence.party_rows`);
    a party's successive rounds take its listed times in order, cycling. Every party 0..n-1 needs one."""
    times: list[list[float]] = [[] for _ in range(n_parties)]
    form, rule = "party,seconds (e.g. 3,1.5)", "seconds >= 0"
    for line, party, row in party_rows(path, n_parties, form, rule):
        try:
            seconds = float(row[1])
        except (ValueError, IndexError):
            raise ValueError(f"{path}, line {line}: write {form}; got {row}") from None
        if not seconds >= 0 or math.isinf(seconds):
            raise ValueError(f"{path}, line {line}: party in [0, {n_parties}) and {rule}; got {row}")
        times[party].append(seconds)
    every_party(times, path, "time")
    return times


@dataclass(frozen=True)
class Law:
    """A law of a local round's seconds (module docstring): its kind and parameters."""

    kind: str
    sigma: float = 1.0
    mean: float = 1.0
    low: float = 0.0

    def sample(self, gen: Any, size: int) -> list[float]:
        """`size` draws from `gen`, a numpy Generator."""
        if self.kind == "constant":
            return [float(self.mean)] * size
        if self.kind == "exponential":
            return [float(v) for v in gen.exponential(self.mean, size)]
        if self.kind == "uniform":
            return [float(v) for v in gen.uniform(self.low, 2 * self.mean - self.low, size)]
        z = [float(v) for v in gen.standard_normal(size)]
        if self.kind == "lognormal":
            return [self.mean * math.exp(self.sigma * v) for v in z]
        if self.kind == "halfnormal":
            return [self.low + self.sigma * abs(v) for v in z]
        raise ValueError(f"unknown party_speed {self.kind!r}; choose one of {', '.join(PARTY_SPEEDS)}")


def party_durations(
    kind: str,
    n_parties: int,
    seed: int,
    sigma: float = 1.0,
    path: str | Path | None = None,
    mean: float = 1.0,
    low: float = 0.0,
) -> list[list[float]]:
    """Each party's simulated seconds per local round, drawn once per party (a list, cycled over its
    rounds): `Law(kind, sigma, mean, low)`'s n draws on the run seed's "party_speed" stream, or a file's
    times (`read_times(path)`)."""
    if kind == "file":
        if path is None:
            raise ValueError("party_speed file needs train_args.party_speed_file")
        return read_times(path, n_parties)
    if kind == "constant":
        return [[float(mean)] for _ in range(n_parties)]
    return [[v] for v in Law(kind, sigma, mean, low).sample(rng(seed, "party_speed"), n_parties)]


@dataclass(frozen=True)
class Costs:
    """What a local round costs besides its drawn seconds: `per_example` (the draw is per training
    example), `bandwidth_bps` (bits a second each way; None: free), `session_s` (a secure sum's
    session, which the party stays in after its upload), and with `per_round` a fresh draw of `law`
    for every local round instead of the party's fixed durations."""

    law: Law | None = None
    per_round: bool = False
    per_example: bool = False
    bandwidth_bps: float | None = None
    seed: int = 0
    session_s: float = 0.0  # secure aggregation: the seconds of the session a party takes part in


ARRIVAL, WAKE = -1, -2  # the clock's own events, beside the parties' ends


class SimClock:
    """Simulated time: `start(party)` schedules the end of the party's next local round,
    `next_instant()` pops every event of the earliest time (party-id order)."""

    def __init__(
        self,
        durations: list[list[float]],
        costs: Costs | None = None,
        presence: Presence | None = None,
        arrivals: Arrivals | None = None,
    ) -> None:
        self.durations = durations
        self.costs = costs or Costs()
        self.presence, self.arrivals = presence, arrivals
        self.jobs = [0] * len(durations)  # rounds started per party (a file's times cycle)
        self.events: list[tuple[float, int]] = []
        self.now = 0.0
        self.lost: set[int] = set()  # parties whose round in flight ends when they go offline
        self.due = 0  # arrivals come, not yet given a slot (`take_arrivals`)
        if arrivals is not None:
            heapq.heappush(self.events, (arrivals.next_after(0.0), ARRIVAL))

    def duration(self, party: int, examples: float = 1.0, nbytes: int = 0) -> float:
        """The seconds `party`'s next local round takes (advances its count): its duration (or, per
        round, a fresh draw keyed by the party and its count), times `examples` where the law is per
        example, plus `nbytes` (down and up) at the bandwidth."""
        costs, job = self.costs, self.jobs[party]
        if costs.per_round and costs.law is not None:
            seconds = costs.law.sample(rng(costs.seed, "party_speed", party, job), 1)[0]
        else:
            times = self.durations[party]
            seconds = times[job % len(times)]
        self.jobs[party] += 1
        if costs.per_example:
            seconds *= examples
        if costs.bandwidth_bps:
            seconds += 8.0 * nbytes / costs.bandwidth_bps
        return seconds + costs.session_s

    def sync_round(self, parties: list[int], costs: dict[int, tuple[float, int]] | None = None) -> float:
        """A synchronous round of `parties` (`costs`: each one's examples and bytes, as `duration`
        takes them): it ends when the slowest ends; returns the new time."""
        costs = costs or {}
        self.now += max((self.duration(p, *costs.get(p, (1.0, 0))) for p in parties), default=0.0)
        return self.now

    def start(self, party: int, examples: float = 1.0, nbytes: int = 0) -> float:
        """Schedule `party`'s round from now; returns when it ends (when the party goes offline, if
        sooner: then its round is `lost`)."""
        end = self.now + self.duration(party, examples, nbytes)
        leaves = None if self.presence is None else self.presence.leaves(party, self.now)
        self.lost.discard(party)
        if leaves is not None and end > leaves:
            end = leaves
            self.lost.add(party)
        heapq.heappush(self.events, (end, party))
        return end

    def online(self, party: int) -> bool:
        """Whether `party` may be given work now (always, without an availability trace)."""
        return self.presence is None or self.presence.leaves(party, self.now) is not None

    def wake_for(self, parties: list[int]) -> None:
        """A WAKE event when the first of `parties` (offline now) comes online, unless one is due by then."""
        assert self.presence is not None
        opens = [t for t in (self.presence.opens(p, self.now) for p in parties) if t is not None]
        if opens and not any(p == WAKE and t <= min(opens) for t, p in self.events):
            heapq.heappush(self.events, (min(opens), WAKE))

    def take_arrivals(self) -> int | None:
        """The arrivals come since last asked (each may start one party; None: no arrival process,
        every free slot is filled at once)."""
        if self.arrivals is None:
            return None
        due, self.due = self.due, 0
        return due

    def state(self) -> dict[str, Any]:
        """The clock as JSON values: the time, each party's rounds begun, the events to come, the
        rounds that will be lost, the arrivals drawn and not yet given a slot."""
        return {
            "now": self.now,
            "jobs": list(self.jobs),
            "events": [list(e) for e in sorted(self.events)],
            "lost": sorted(self.lost),
            "due": self.due,
            "arrivals": None if self.arrivals is None else self.arrivals.count,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.now, self.jobs = float(state["now"]), [int(j) for j in state["jobs"]]
        self.events = [(float(t), int(p)) for t, p in state["events"]]
        heapq.heapify(self.events)
        self.lost, self.due = {int(p) for p in state.get("lost", [])}, int(state.get("due", 0))
        if self.arrivals is not None:
            self.arrivals.count = int(state["arrivals"])

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
        """(time, ids) of the earliest events, sorted (the clock's own first); the clock moves to it.
        An ARRIVAL counts one arrival due and schedules the next."""
        if not self.events:
            raise RuntimeError(
                "no party is training and none comes online again: the simulated clock has nothing to "
                "wait for (train_args.availability_file)"
            )
        when = self.events[0][0]
        ids = []
        while self.events and self.events[0][0] == when:
            ids.append(heapq.heappop(self.events)[1])
        self.now = when
        if ARRIVAL in ids:
            self.due += 1
            heapq.heappush(self.events, (self.arrivals.next_after(when), ARRIVAL))
        return when, sorted(ids)
