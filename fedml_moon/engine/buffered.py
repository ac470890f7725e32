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
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from fedml_moon.algorithms.base import Payload
from fedml_moon.buffering import buffer_shape
from fedml_moon.config import Config
from fedml_moon.core.aggregation import payload_nbytes, payload_numel
from fedml_moon.core.fedbuff import Buffer, SimClock, discount, party_durations
from fedml_moon.core.seeds import rng
from fedml_moon.engine.parties import PartyRunner
from fedml_moon.engine.rounds import ServerRounds
from fedml_moon.engine.simulation import StandaloneSimulation
from fedml_moon.engine.summed import Result
from fedml_moon.errors import BadUpload, ConfigError
from fedml_moon.privacy.party import PartyVector, party_vector
from fedml_moon.privacy.sums import Sums, contribution

log = logging.getLogger(__name__)
LEFT_OUT_LIMIT = 10  # x max(K, concurrency) updates left out in a row stop the run (no buffer fills)


@dataclass
class Job:
    """A party's local round in flight: the model version it started from, what it was sent, and
    (once trained) its result."""

    start: int
    payload: Payload
    result: Result | None = None


def make_clock(cfg: Config, buffered: bool) -> SimClock | None:
    """The run's simulated clock (`train_args.party_speed`; a buffered run's default is constant),
    or None for a synchronous run without one."""
    train = cfg.train_args
    speed = train.party_speed or ("constant" if buffered else None)
    if speed is None:
        return None
    n, seed = train.client_num_in_total, cfg.common_args.random_seed
    try:
        return SimClock(party_durations(speed, n, seed, train.party_speed_sigma, train.party_speed_file))
    except ValueError as err:
        raise ConfigError(f"train_args.party_speed_file: {err}") from None


def refuse_resume(cfg: Config) -> None:
    """A buffered run cannot resume: its event queue and buffer are not in the checkpoint."""
    if cfg.server_args.aggregation == "buffered":
        raise ConfigError(
            "--resume: a buffered run (server_args.aggregation: buffered) cannot resume yet: its event "
            "queue and buffer are not in the checkpoint; start it again without --resume"
        )


def make_loop(cfg: Config, server: ServerRounds, runner: PartyRunner, resume: bool) -> StandaloneSimulation:
    """The standalone loop `cfg` asks for: buffered (`server_args.aggregation`) or synchronous, with
    its simulated clock; a resumed synchronous run's clock is replayed to where it stopped."""
    train, buffered = cfg.train_args, cfg.server_args.aggregation == "buffered"
    clock = make_clock(cfg, buffered)
    if buffered:
        if resume:
            refuse_resume(cfg)
        return BufferedSimulation(server, runner, cfg, clock)
    loop = StandaloneSimulation(server, runner, train.checkpoint_every, train.stream_uploads)
    loop.clock = clock
    if resume:
        loop.resume(cfg)
        for round_idx in range(loop.start_round if clock is not None else 0):
            clock.sync_round(server.parties(round_idx))
    return loop


class BufferedSimulation(StandaloneSimulation):
    """FedBuff rounds in one process (module docstring); writes no checkpoint."""

    def __init__(self, server: ServerRounds, runner: PartyRunner, cfg: Config, clock: SimClock) -> None:
        super().__init__(server, runner, checkpoint_every=0)
        self.clock, self.options = clock, cfg.server_args
        self.concurrency, self.size = buffer_shape(cfg)
        self.gen = rng(cfg.common_args.random_seed, "buffered")
        self.version = 0
        self.inflight: dict[int, Job] = {}
        self.buffer = Buffer()
        self.vectors: dict[int, PartyVector] = {}  # privacy_args: the buffer's parties' vectors
        self.refused_stale = 0  # this buffer's updates refused as too stale
        self.rejected: dict[int, str] = {}  # this buffer's unusable uploads
        self.left_out = 0  # updates left out (too stale, unusable) since the last one kept

    # --- the parties' side ----------------------------------------------------------------------
    def dispatch(self) -> None:
        """Fill the free slots with parties not training (drawn on the "buffered" stream), each given
        the newest model; under privacy_args not those whose update waits in the buffer either (a
        buffer holds one update per party: one input of its secure sum, one clipped change)."""
        count = self.concurrency - len(self.inflight)
        waiting = self.vectors if self.server.privacy is not None else {}
        idle = [p for p in range(self.server.n_parties) if p not in self.inflight and p not in waiting]
        if count <= 0 or not idle:
            return
        chosen = sorted(int(p) for p in self.gen.choice(idle, min(count, len(idle)), replace=False))
        self.server.args.round_idx = self.version
        for party in chosen:
            payload = self.aggregator.get_model_params_for(party)
            self.server.totals["bytes_down"] += payload_nbytes(payload)
            self.server.totals["params_down"] += payload_numel(payload)
            self.inflight[party] = Job(self.version, payload)
            self.clock.start(party)

    def result(self, party: int, job: Job) -> Result:
        """`party`'s trained result; trains it, together with every party in flight from the same
        model version that has not trained yet (their results are the same whenever they train)."""
        if job.result is None:
            group = {p: j for p, j in self.inflight.items() if j.result is None and j.start == job.start}
            group[party] = job
            tasks = [(p, group[p].payload) for p in sorted(group)]
            for (p, _), res in zip(tasks, self.runner.train_many(tasks, job.start), strict=True):
                group[p].result = res
        return job.result

    # --- the server's side ----------------------------------------------------------------------
    def arrive(self, party: int) -> None:
        """`party`'s update arrives: refused when too stale or unusable, else into the buffer; a full
        buffer is applied. So many updates left out in a row that no buffer could fill stop the run."""
        job = self.inflight.pop(party)
        samples, upload = self.server.weighed({party: self.result(party, job)})[party]
        job.result = None
        tau = self.version - job.start
        if self.too_stale(party, tau) or not self.usable(party, job, upload):
            self.left_out += 1
            if self.left_out >= LEFT_OUT_LIMIT * max(self.size, self.concurrency):
                raise BadUpload(
                    f"round {self.version}: {self.left_out} updates in a row left out (too stale: "
                    f"{self.refused_stale}, unusable: {self.rejected}), so no buffer fills"
                )
            return
        self.left_out = 0
        s = discount(self.options.staleness, tau, self.options.staleness_exponent)
        keep = (samples, {"metrics": dict(upload.get("metrics") or {})})
        if self.server.privacy is not None:  # the party's side: its clipped, discounted vector
            self.vectors[party] = party_vector(upload, job.payload, self.server.privacy.plan(party, s))
            self.buffer.add({}, 1.0, tau, keep, party)
        else:
            self.server.totals["bytes_up"] += payload_nbytes(upload)
            self.server.totals["params_up"] += payload_numel(upload)
            if self.server.save_party_models:
                self.server.save_uploads({party: upload})
            algorithm = self.aggregator.algorithm
            ratio = float(algorithm.sum_weight(samples)) if self.options.buffer_weights == "samples" else 1.0
            addends = contribution(upload, job.payload, algorithm.summed, ratio * s)
            self.buffer.add(addends, ratio, tau, keep, party)
        if len(self.buffer) >= self.size:
            self.flush()

    def too_stale(self, party: int, tau: int) -> bool:
        """`server_args.max_staleness`: an update staler is refused, counted and logged."""
        limit = self.options.max_staleness
        if limit is None or tau <= limit:
            return False
        self.refused_stale += 1
        log.warning(
            "round %d: party %d's update is %d rounds stale (max_staleness %d): refused",
            self.version,
            party,
            tau,
            limit,
        )
        return True

    def usable(self, party: int, job: Job, upload: Payload) -> bool:
        """The server's checks of an upload (`engine.uploads`) against what the party was sent."""
        self.server.sent = {party: job.payload}
        why = self.server.upload_problem(party, upload)
        if why is None:
            return True
        log.error("round %d: party %d's upload is left out: %s", self.version, party, why)
        self.rejected[party] = why
        if self.server.on_bad_upload == "stop":
            raise BadUpload(f"round {self.version}: {self.rejected} (train_args.on_bad_upload: stop)")
        return False

    def flush(self) -> dict[str, Any] | None:
        """Apply the buffer (one round): the new global state, the round's evaluations and record.
        Under privacy_args its parties' vectors are summed (securely, with DP's noise and accounting),
        unless the release would pass `dp_target_epsilon`: then the run stops, the buffer unreleased."""
        buffer, round_idx, privacy = self.buffer, self.version, self.server.privacy
        self.server.rejected = dict(self.rejected)
        if privacy is not None and not privacy.allows(sorted(self.vectors)):
            log.warning(
                "privacy_args.dp_target_epsilon: the run stops after %d rounds: the next buffer's sum "
                "would pass epsilon %s; it is not released",
                round_idx,
                privacy.options.dp_target_epsilon,
            )
            self.rounds = round_idx
            return None
        if privacy is not None:
            sums, self.vectors = self.server.private_sum(round_idx, self.vectors), {}
            ordered = self.server.apply_sums(sums)
        else:
            sums = Sums(buffer.weight, len(buffer), buffer.fields)
            ordered = self.server.apply_sums(sums, [keep for _, keep in buffer.kept])
        extra = {"sim_time_s": self.clock.now, **buffer.stats(), "refused_stale": self.refused_stale}
        self.server.args.round_idx = round_idx
        record = self.close_round(round_idx, ordered, extra)
        self.version += 1
        self.buffer, self.refused_stale, self.rejected = Buffer(), 0, {}
        self.server.started = time.perf_counter()
        return record

    # --- the run --------------------------------------------------------------------------------
    def resume(self, cfg: Config) -> int:
        """Refused (`refuse_resume`)."""
        refuse_resume(cfg)
        return 0

    def run(self) -> None:
        status = "failed"
        self.runner.load_state({})  # a new run: states an earlier run left in a disk store are not its own
        log.info(
            "buffered aggregation: %d parties training at once, %d updates a round, staleness %s; "
            "no checkpoints are written",
            self.concurrency,
            self.size,
            self.options.staleness,
        )
        try:
            self.server.started = time.perf_counter()
            self.dispatch()
            with tqdm(total=self.rounds, desc="rounds", unit="round", disable=None) as bar:
                while self.version < self.rounds:
                    before = self.version
                    _, parties = self.clock.next_instant()
                    for party in parties:
                        if self.version < self.rounds:
                            self.arrive(party)
                    bar.update(self.version - before)
                    if self.version < self.rounds:
                        self.dispatch()
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.summary = self.server.finish(status)
