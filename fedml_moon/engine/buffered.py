"""Buffered asynchronous aggregation (FedBuff) in the standalone simulation, on a simulated clock.

`concurrency` parties train at once, each from the newest global model when it is given work. Each
arriving update, discounted by its staleness, goes into the buffer (`core.fedbuff`) in the server
algorithm's sum form (`privacy.sums.contribution`: r * (model - model it was sent) per "update"
field, "sum" fields as they are); once the buffer holds `buffer_size` updates the algorithm's
`aggregate_sums` applies it (server_lr and momentum in its `step`): one round, one record. A freed
slot is refilled at once, after every arrival of that simulated instant, with a party drawn (seeded)
among those not training. The training itself is the synchronous loop's (`PartyRunner.train_many`,
parties that start from the same model version trained together); no algorithm knows the mode.
"""

from __future__ import annotations

import logging
import time

from tqdm import tqdm

from fedml_moon.config.load import Config
from fedml_moon.core.presence import Arrivals, Presence, read_windows
from fedml_moon.core.sim_clock import Costs, Law, SimClock, party_durations
from fedml_moon.engine.buffer_rounds import BufferedRounds, Job
from fedml_moon.engine.parties import PartyRunner
from fedml_moon.engine.resume import due
from fedml_moon.engine.rounds import ServerRounds
from fedml_moon.engine.simulation import StandaloneSimulation
from fedml_moon.engine.summed import Result
from fedml_moon.errors import ConfigError

log = logging.getLogger(__name__)


def make_clock(cfg: Config, buffered: bool) -> SimClock | None:
    """The run's simulated clock (`train_args.party_speed` and its keys; a buffered run's default is
    constant), or None for a synchronous run without one."""
    train = cfg.train_args
    speed = train.party_speed or ("constant" if buffered else None)
    if speed is None:
        return None
    n, seed = train.client_num_in_total, cfg.common_args.random_seed
    law = Law(speed, train.party_speed_sigma, train.party_speed_mean, train.party_speed_min)
    bandwidth = None if train.bandwidth_mbps is None else train.bandwidth_mbps * 1e6
    per_round = train.party_speed_draw == "round" and speed != "file"
    session = train.secure_session_s if cfg.privacy_args.secure_aggregation else 0.0
    costs = Costs(law, per_round, train.party_speed_per_example, bandwidth, seed, session)
    try:
        durations = party_durations(speed, n, seed, law.sigma, train.party_speed_file, law.mean, law.low)
    except ValueError as err:
        raise ConfigError(f"train_args.party_speed_file: {err}") from None
    try:
        trace = None if train.availability_file is None else read_windows(train.availability_file, n)
    except ValueError as err:
        raise ConfigError(f"train_args.availability_file: {err}") from None
    presence = None if trace is None else Presence(trace)
    rate = cfg.server_args.arrival_rate
    return SimClock(durations, costs, presence, None if rate is None else Arrivals(rate, seed))


def make_loop(cfg: Config, server: ServerRounds, runner: PartyRunner, resume: bool) -> StandaloneSimulation:
    """The standalone loop `cfg` asks for: buffered (`server_args.aggregation`) or synchronous, with
    its simulated clock (a synchronous run's is kept in its checkpoints; one from before they kept it
    is replayed to where the run stopped)."""
    train, buffered = cfg.train_args, cfg.server_args.aggregation == "buffered"
    clock = make_clock(cfg, buffered)
    if buffered:
        loop = BufferedSimulation(server, runner, cfg, clock)
        if resume:
            loop.resume(cfg)
        return loop
    loop = StandaloneSimulation(server, runner, train.checkpoint_every, train.stream_uploads)
    loop.clock = server.clock = clock
    if resume:
        loop.resume(cfg)
        replay = clock is not None and not any(clock.jobs)
        for round_idx in range(loop.start_round if replay else 0):
            clock.sync_round(server.parties(round_idx))
    return loop


class BufferedSimulation(StandaloneSimulation):
    """FedBuff rounds in one process (module docstring). A checkpoint is written after the simulated
    instant in which a round that is due (`train_args.checkpoint_every`) was applied, once its freed
    slots are filled: the jobs in flight (trained or not), the buffer, the clock and the draws with it
    (`BufferedRounds.state`), so a resumed run goes on as if never stopped."""

    def __init__(self, server: ServerRounds, runner: PartyRunner, cfg: Config, clock: SimClock) -> None:
        super().__init__(server, runner, cfg.train_args.checkpoint_every)
        self.core = BufferedRounds(server, cfg, clock)
        self.clock = clock

    def result(self, party: int, job: Job) -> Result:
        """`party`'s trained result; trains it, together with every party in flight from the same
        model version that has not trained yet (their results are the same whenever they train)."""
        if job.result is None:
            inflight = self.core.inflight
            group = {p: j for p, j in inflight.items() if j.result is None and j.start == job.start}
            group[party] = job
            tasks = [(p, group[p].payload) for p in sorted(group)]
            for (p, _), res in zip(tasks, self.runner.train_many(tasks, job.start), strict=True):
                group[p].result = res
        return job.result

    def close_round(self, round_idx: int, ordered: list, extra: dict | None = None) -> dict:
        """An evaluation round's parties report after training their tasks in flight, as a silo, which
        handles its messages in order, reports after the tasks it was sent before the EVAL."""
        if self.server.evaluation.needs_party_eval(round_idx):
            for party, job in sorted(self.core.inflight.items()):
                self.result(party, job)
        return super().close_round(round_idx, ordered, extra)

    def arrive(self, party: int) -> None:
        """`party`'s update arrives (`BufferedRounds.take`); a full buffer is applied and recorded, or,
        refused by `dp_target_epsilon`, ends the run."""
        job = self.core.inflight[party]
        _, upload = self.result(party, job)
        job.result = None
        if not self.core.take(party, upload):
            return
        applied = self.core.apply()
        if applied is None:
            self.rounds = self.core.version
            return
        self.close_round(*applied)

    def instant(self) -> None:
        """The updates of the next simulated instant, in party-id order, then the freed slots filled."""
        core = self.core
        _, parties = self.clock.next_instant()
        for party in parties:
            if party >= 0 and core.version < self.rounds:  # < 0: the clock's own (arrival, wake)
                self.arrive(party)
        if core.version < self.rounds:
            core.dispatch()

    # --- the run --------------------------------------------------------------------------------
    def run(self) -> None:
        core, config = self.core, self.checkpoint_config()
        log.info(
            "buffered aggregation: %d parties training at once, %d updates a round, staleness %s",
            core.concurrency,
            core.size,
            core.options.staleness,
        )
        with self.finishing():
            self.server.started = time.perf_counter()
            if self.start_round == 0:  # a new run: states an earlier run left in a disk store are not its own
                self.runner.load_state({})
                core.dispatch()
            with tqdm(total=self.rounds, desc="rounds", unit="round", disable=None) as bar:
                bar.update(core.version)
                while core.version < self.rounds:
                    before = core.version
                    self.instant()
                    bar.update(core.version - before)
                    every = self.checkpoint_every
                    due_now = [r for r in range(before, core.version) if due(every, r, self.rounds)]
                    if due_now:
                        self.checkpoint(due_now[-1], config)
