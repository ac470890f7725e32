"""A buffered run replayed from its records in the standalone simulation (`fedml-moon replay`).

Each record of a buffered run (one buffer applied, model version r -> r + 1) names its updates
(`updates`: [party, the version it started from], in arrival order) and the updates left out while
it filled (`left_out`: [party, version, why, how many of `updates` had arrived before it]). Merged by
position these are the run's arrivals, in order. The replay rebuilds the run from its config (same
seed, data and initial model), sends each arrival's party what the server sent it at its start
version (`get_model_params_for` while the server is at that version), trains every party's jobs in
its own order (so its state, e.g. MOON's previous model, and its data stream advance as in the run,
left-out jobs included) and feeds each through `BufferedRounds.take` as the run's server did; a full
buffer is applied and recorded. Wherever the replay decides otherwise than the record (an update
kept or left out, a buffer full early or late, another training loss) it stops: ReplayDiverged.
Under secure aggregation the parties a record names in `not_summed` (they left its secure sum) are
taken out of the buffer's sum, as they were in the run.

Parties that start from the same version are trained together (`PartyRunner.train_many`), as the
run did; with `parties_in_parallel` above 1 the groups may differ from the run's, which moves the
model by float rounding only. Updates in flight when the run ended are in no record and not trained;
the replay's `bytes_down` counts only the downloads of updates that arrived.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

from fedml_moon.algorithms.base import Payload
from fedml_moon.config.load import Config
from fedml_moon.core.aggregation import payload_nbytes, payload_numel
from fedml_moon.engine.buffer_rounds import OFFLINE, BufferedRounds, Job
from fedml_moon.engine.parties import PartyRunner
from fedml_moon.engine.rounds import ServerRounds
from fedml_moon.engine.simulation import StandaloneSimulation
from fedml_moon.engine.summed import Result
from fedml_moon.errors import ConfigError

log = logging.getLogger(__name__)
LOSS_RTOL = 1e-3  # a record's training loss, replayed: float rounding apart, the same parties' losses


class ReplayDiverged(Exception):
    """The replay decided otherwise than the run's records (or they are not one run's)."""


@dataclass(frozen=True)
class Arrival:
    """One update arriving at the server: in the record of round `record`, from `party`, trained
    from model version `start`; `why` the record's reason it was left out (None: kept)."""

    record: int
    party: int
    start: int
    why: str | None = None
    fills: bool = False  # the record's last update: its buffer is applied once it is in

    @property
    def kept(self) -> bool:
        return self.why is None


def arrivals(records: list[dict[str, Any]]) -> list[Arrival]:
    """The run's arrivals in order: each record's `updates` and `left_out` merged by position. A
    record without `updates`, out of order, or naming a version after its own is a ConfigError."""
    out: list[Arrival] = []
    for r, record in enumerate(records):
        if record.get("round") != r or not isinstance(record.get("updates"), list):
            raise ConfigError(
                f"metrics.jsonl, record {r}: not a buffered run's record of round {r} (`round` and "
                "`updates` are missing or out of order); replay a run of server_args.aggregation: buffered"
            )
        left = defaultdict(list)
        for party, start, why, position in record.get("left_out") or []:
            left[int(position)].append(Arrival(r, int(party), int(start), str(why)))
        last = len(record["updates"]) - 1
        for i, (party, start) in enumerate(record["updates"]):
            out += left.pop(i, [])
            out.append(Arrival(r, int(party), int(start), fills=i == last))
        out += [a for i in sorted(left) for a in left[i]]
    for a in out:
        if not 0 <= a.start <= a.record:
            raise ConfigError(
                f"metrics.jsonl, round {a.record}: party {a.party}'s version {a.start} is not a past one"
            )
    return out


def check_order(events: list[Arrival]) -> None:
    """A party trains one job at a time: its next starts from a version no older than the one the
    server was at once its last update arrived (after the record it filled, the next version)."""
    since: dict[int, tuple[int, int]] = {}  # party -> (version its last update left it at, that round)
    for a in events:
        if a.party in since and a.start < since[a.party][0]:
            raise ReplayDiverged(
                f"the replay diverged at round {a.record}: party {a.party}'s update from version {a.start} "
                f"began before its previous update arrived (round {since[a.party][1]}): the records are "
                "not one run's"
            )
        since[a.party] = (a.record + int(a.fills), a.record)


class ReplaySimulation(StandaloneSimulation):
    """A buffered run's records replayed (module docstring); writes no checkpoint."""

    def __init__(
        self, server: ServerRounds, runner: PartyRunner, cfg: Config, records: list[dict[str, Any]]
    ) -> None:
        super().__init__(server, runner, checkpoint_every=0)
        self.core = BufferedRounds(server, cfg, None)
        self.records, self.events = records, arrivals(records)
        check_order(self.events)
        self.rounds = len(records)
        self.starting: dict[int, list[int]] = defaultdict(list)  # version -> arrivals that start there
        self.queue: dict[int, deque[int]] = defaultdict(deque)  # party -> its arrivals not yet trained
        for i, a in enumerate(self.events):
            self.starting[a.start].append(i)
            self.queue[a.party].append(i)
        self.sent: dict[int, Payload] = {}  # arrival -> what its party was sent
        self.results: dict[int, Result] = {}  # arrival -> its party's trained result

    def send(self, version: int) -> None:
        """What the server sends, at `version`, the parties of the arrivals that start there."""
        self.server.args.round_idx = version
        for i in self.starting.pop(version, []):
            payload = self.aggregator.get_model_params_for(self.events[i].party)
            self.server.totals["bytes_down"] += payload_nbytes(payload)
            self.server.totals["params_down"] += payload_numel(payload)
            self.sent[i] = payload

    def result(self, i: int) -> Result:
        """Arrival `i`'s trained result; trains it together with every party whose next job (in its
        own order) starts from the same version."""
        if i not in self.results:
            start = self.events[i].start
            group = sorted(
                (self.events[q[0]].party, q[0])
                for q in self.queue.values()
                if q and self.events[q[0]].start == start
            )
            tasks = [(party, self.sent[j]) for party, j in group]
            for (party, j), res in zip(group, self.runner.train_many(tasks, start), strict=True):
                self.queue[party].popleft()
                self.results[j] = res
        return self.results.pop(i)

    def arrive(self, i: int) -> bool:
        """Arrival `i` through `BufferedRounds.take`, checked against its record; returns whether the
        buffer is full."""
        a, core = self.events[i], self.core
        _, upload = self.result(i)
        core.inflight[a.party] = Job(a.start, self.sent.pop(i))
        kept = len(core.updates)
        full = core.take(a.party, upload, offline=a.why == OFFLINE)  # the trace's, as the clock's
        if (len(core.updates) > kept) != a.kept:
            said = "kept" if a.kept else f"left out ({a.why})"
            raise ReplayDiverged(
                f"the replay diverged at round {a.record}: party {a.party}'s update from version "
                f"{a.start} was {said} in the run, not in the replay"
            )
        return full

    def replay_round(self, r: int, mine: list[int]) -> None:
        """Record `r`'s arrivals (`mine`, indices), its buffer applied and recorded, checked."""
        record, core = self.records[r], self.core
        self.send(r)
        for n, i in enumerate(mine):
            if self.arrive(i) and n < len(mine) - 1:
                raise ReplayDiverged(
                    f"the replay diverged at round {r}: the buffer filled before the record's last update "
                    f"({core.size} updates, the record names {len(record['updates'])})"
                )
        if len(core.buffer) < core.size:
            raise ReplayDiverged(
                f"the replay diverged at round {r}: the record's {len(record['updates'])} updates leave the "
                f"buffer short of server_args.buffer_size {core.size}"
            )
        for party in record.get("not_summed", []):  # its secure sum went on without them
            core.vectors.pop(party, None)
        applied = core.apply()
        if applied is None:
            raise ReplayDiverged(f"the replay diverged at round {r}: privacy_args refused to release it")
        round_idx, ordered, extra = applied
        if "sim_time_s" in record:  # the run's clock: the replay has none of its own
            held = {k: extra.pop(k) for k in ("updates", "left_out")}
            extra = {**extra, "sim_time_s": record["sim_time_s"], **held}
        self.check_loss(record, self.close_round(round_idx, ordered, extra))

    @staticmethod
    def check_loss(record: dict[str, Any], mine: dict[str, Any]) -> None:
        """The replayed round's training loss is the record's, float rounding apart (LOSS_RTOL)."""
        want, got = record.get("train_loss"), mine.get("train_loss")
        if want is None or got is None or math.isclose(got, want, rel_tol=LOSS_RTOL, abs_tol=1e-9):
            return
        raise ReplayDiverged(
            f"the replay diverged at round {record['round']}: its updates (party, version) "
            f"{record['updates']} trained to a "
            f"loss of {got:.6g}, the run recorded {want:.6g}"
        )

    def resume(self, cfg: Config) -> int:
        raise ConfigError("--resume: a replay starts from its run's records; run it again instead")

    def run(self) -> None:
        self.runner.load_state({})  # a new run: states an earlier run left in a disk store are not its own
        log.info("replaying %d rounds, %d updates arrived", len(self.records), len(self.events))
        by_round: dict[int, list[int]] = defaultdict(list)
        for i, a in enumerate(self.events):
            by_round[a.record].append(i)
        with self.finishing():
            self.server.started = time.perf_counter()
            for r in range(len(self.records)):
                self.replay_round(r, by_round[r])
