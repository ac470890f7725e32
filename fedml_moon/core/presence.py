"""When parties can take work on the simulated clock: an availability trace (FedScale replays device
traces: a party is given work only while online, and a round it cannot finish before it goes offline
is lost) and new parties arriving as a Poisson process (FLSim's asynchronous trainer starts one at
each arrival). Pure Python; `core/sim_clock.py` schedules what they say."""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fedml_moon.core.seeds import rng


def party_rows(
    path: str | Path, n_parties: int, form: str, rule: str
) -> Iterator[tuple[int, int, list[str]]]:
    """(line, party, row) of each row of a per-party CSV file: lines starting with # and a header row
    before the first row are skipped; a row whose first cell is no integer is an error naming the
    line and `form` (how to write a row), one whose party is outside [0, n_parties) naming `rule`
    (what the other cells must be, as its reader's own errors say)."""
    first = True  # the first row that is not a comment may be a header
    with open(path, newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].strip().startswith("#"):
                continue
            header, first = first and not row[0].strip().isdigit(), False
            if header:
                continue
            try:
                party = int(row[0])
            except ValueError:
                raise ValueError(f"{path}, line {line}: write {form}; got {row}") from None
            if not 0 <= party < n_parties:
                raise ValueError(f"{path}, line {line}: party in [0, {n_parties}) and {rule}; got {row}")
            yield line, party, row


def every_party(per_party: list[list], path: str | Path, what: str) -> None:
    """An error naming the parties (the first 10) that `path` gives no `what`."""
    missing = [p for p, rows in enumerate(per_party) if not rows]
    if missing:
        raise ValueError(
            f"{path}: no {what} for parties {missing[:10]} (each of the {len(per_party)} needs one)"
        )


def read_windows(path: str | Path, n_parties: int) -> list[list[tuple[float, float]]]:
    """A trace of CSV rows `party,start,end` (simulated seconds, end may be inf; `party_rows`): each
    party's online windows, sorted and merged. Every party 0..n-1 needs one."""
    windows: list[list[tuple[float, float]]] = [[] for _ in range(n_parties)]
    form, rule = "party,start,end (e.g. 3,0,120.5)", "0 <= start < end"
    for line, party, row in party_rows(path, n_parties, form, rule):
        try:
            start, end = float(row[1]), float(row[2])
        except (ValueError, IndexError):
            raise ValueError(f"{path}, line {line}: write {form}; got {row}") from None
        if not 0 <= start < end or math.isnan(end):
            raise ValueError(f"{path}, line {line}: party in [0, {n_parties}) and {rule}; got {row}")
        windows[party].append((start, end))
    every_party(windows, path, "window")
    return [_merged(w) for w in windows]


def _merged(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@dataclass
class Presence:
    """Each party's online windows (`read_windows`)."""

    windows: list[list[tuple[float, float]]]

    def leaves(self, party: int, now: float) -> float | None:
        """When `party`, online at `now`, goes offline; None where it is offline at `now`."""
        spans = self.windows[party]
        i = bisect.bisect_right(spans, (now, math.inf)) - 1
        return spans[i][1] if i >= 0 and spans[i][0] <= now < spans[i][1] else None

    def opens(self, party: int, now: float) -> float | None:
        """The next time after `now` that `party` comes online; None: never again."""
        return next((start for start, _ in self.windows[party] if start > now), None)


@dataclass
class Arrivals:
    """New parties arriving as a Poisson process of `rate` a simulated second: the k-th gap is an
    exponential draw keyed by k on the run seed's "arrivals" stream."""

    rate: float
    seed: int
    count: int = 0

    def next_after(self, now: float) -> float:
        gap = float(rng(self.seed, "arrivals", self.count).exponential(1.0 / self.rate))
        self.count += 1
        return now + gap
