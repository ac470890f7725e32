"""The server's side of buffered aggregation (FedBuff), whatever drives it: the standalone loop on its
simulated clock (`engine.buffered`), or the distributed server at the parties' real pace, or on the
clock in the MPI simulation (`distributed.server.buffered`).

`dispatch` gives the free slots to parties not training (drawn on the run seed's "buffered" stream)
with the newest global model; `take` is one party's update arriving: refused when too stale or
unusable, else added, discounted by its staleness, to the buffer in the server algorithm's sum form
(`privacy.sums.contribution`: r * (model - model it was sent) per "update" field, "sum" fields as
they are; under `privacy_args` the party's clipped, discounted vector); `apply` applies a full buffer
with the algorithm's `aggregate_sums` (the server's optimiser in its `step`): one round. FedAsync
(`server_args.buffered_rule: fedasync`, Xie et al. 2019) measures each update against the current
model instead, times alpha: x <- x + alpha s(tau) (x_party - x), K = 1. Each round's
record names its updates (`updates`: [party, the version it started from], in arrival order) and the
updates left out since the round before (`left_out`: [party, version, why, how many of `updates`
had arrived before it]), so that the run can be replayed. Under secure aggregation in the distributed
modes (`remote`) a party's update never reaches the server: its silo holds it, the buffer keeps the
party's start version and discount (`plans`), and the server sums the buffer with its parties over
the network (`distributed.server.buffered_secure`) before `apply`. Pure PyTorch; no algorithm knows it is
buffered.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fedml_moon.algorithms.base import Payload
from fedml_moon.config.load import Config
from fedml_moon.core.aggregation import payload_nbytes, payload_numel
from fedml_moon.core.buffering import buffer_shape
from fedml_moon.core.fedbuff import Buffer, discount, restate, stat_shift
from fedml_moon.core.seeds import rng
from fedml_moon.core.sim_clock import SimClock
from fedml_moon.core.validate import spec_shapes
from fedml_moon.engine.rounds import ServerRounds
from fedml_moon.engine.summed import Result
from fedml_moon.errors import BadUpload
from fedml_moon.privacy.party import PartyVector, party_vector
from fedml_moon.privacy.sums import UPDATE, Sums, contribution

log = logging.getLogger(__name__)
OFFLINE = "went offline"  # why a round cut off by its party's availability window is left out
LEFT_OUT_LIMIT = 10  # x max(K, concurrency) updates left out in a row stop the run (no buffer fills)


@dataclass
class Job:
    """A party's local round in flight: the model version it started from, what it was sent, (once
    trained, in the standalone loop) its result, and what its upload must hold (the algorithm's
    `upload_spec` when it was sent, as `core.validate.spec_shapes`; None from an older checkpoint)."""

    start: int
    payload: Payload
    result: Result | None = None
    spec: dict | None = field(default=None, repr=False, compare=False)


class BufferedRounds:
    """One run's buffer, jobs in flight and model version (module docstring)."""

    def __init__(self, server: ServerRounds, cfg: Config, clock: SimClock | None) -> None:
        self.server, self.options, self.clock = server, cfg.server_args, clock
        self.concurrency, self.size = buffer_shape(cfg)
        self.gen = rng(cfg.common_args.random_seed, "buffered")
        self.version = 0
        self.inflight: dict[int, Job] = {}
        self.arrived: dict[int, Payload] = {}  # distributed: uploads in, not yet taken (arrival order)
        self.held: list[dict[int, Payload]] = []  # a resumed one's: those of its checkpoint, by message
        self.buffer = Buffer()
        self.vectors: dict[int, PartyVector] = {}  # privacy_args: the buffer's parties' vectors
        self.remote = False  # the buffer's secure sum runs among its parties (distributed modes)
        self.plans: dict[int, list] = {}  # remote: the buffer's parties' [start version, discount]
        self.updates: list[list[int]] = []  # this buffer's [party, start version], in arrival order
        self.left: list[list[Any]] = []  # left out since the last record: [party, start, why, position]
        self.refused_stale = 0  # this buffer's updates refused as too stale
        self.rejected: dict[int, str] = {}  # this buffer's unusable uploads
        self.left_out = 0  # updates left out (too stale, unusable) since the last one kept
        self.unbuffered = 0  # `remote`: updates taken out of the buffer since the last applied
        server.buffered = self  # its state goes into the server's checkpoint

    def state(self) -> dict[str, Any]:
        """Everything of the buffered rounds a checkpoint keeps (tensors and JSON values): the jobs in
        flight with what they were sent (and, trained, their results), the uploads arrived but not yet
        taken (the distributed server's, in batches of the messages they came in), the buffer, the
        draws' and the clock's state."""
        vectors = {p: [v.vector, v.entries, v.metric_names, v.norm] for p, v in self.vectors.items()}
        jobs = {p: [j.start, j.payload, j.result, j.spec] for p, j in self.inflight.items()}
        return {
            "version": self.version,
            "inflight": jobs,
            "arrived": [[[p, upload] for p, upload in self.arrived.items()]] if self.arrived else [],
            "buffer": self.buffer.state(),
            "vectors": vectors,
            "plans": self.plans,
            "updates": self.updates,
            "left": self.left,
            "counts": [self.refused_stale, self.left_out, self.unbuffered],
            "rejected": self.rejected,
            "draws": self.gen.bit_generator.state,
            "clock": None if self.clock is None else self.clock.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore `state()`."""
        self.version = int(state["version"])
        self.inflight = {int(p): Job(int(j[0]), j[1], j[2], *j[3:4]) for p, j in state["inflight"].items()}
        self.arrived = {}
        self.held = [{int(p): upload for p, upload in batch} for batch in state.get("arrived", [])]
        self.buffer = Buffer.from_state(state["buffer"])
        self.vectors = {
            int(p): PartyVector(v, [tuple(e) for e in entries], list(names), float(norm))
            for p, (v, entries, names, norm) in state["vectors"].items()
        }
        self.plans = {int(p): [int(v), float(s)] for p, (v, s) in state.get("plans", {}).items()}
        self.updates, self.left = [list(u) for u in state["updates"]], [list(x) for x in state["left"]]
        self.refused_stale, self.left_out, self.unbuffered = (int(c) for c in [*state["counts"], 0][:3])
        self.rejected = {int(p): str(w) for p, w in state["rejected"].items()}
        self.gen.bit_generator.state = state["draws"]
        if self.clock is not None:
            self.clock.load_state(state["clock"])

    @property
    def aggregator(self) -> Any:
        return self.server.aggregator

    def now(self) -> float | None:
        """The simulated second (None at real pace)."""
        return None if self.clock is None else self.clock.now

    # --- the parties' side ----------------------------------------------------------------------
    def dispatch(self, busy: frozenset[int] = frozenset()) -> dict[int, Payload]:
        """Fill the free slots with parties not training and not in `busy` (parties that cannot take
        work now, e.g. of a silo that is gone), drawn on the "buffered" stream, each given the newest
        model; under privacy_args not those whose update waits in the buffer either (a buffer holds
        one update per party: one input of its secure sum, one clipped change)."""
        count = self.concurrency - len(self.inflight)
        waiting = {**self.vectors, **self.plans} if self.server.privacy is not None else {}
        idle = [
            p
            for p in range(self.server.n_parties)
            if p not in self.inflight and p not in waiting and p not in busy
        ]
        if self.clock is not None:
            count, idle = self.on_the_clock(count, idle)
        if count <= 0 or not idle:
            return {}
        chosen = sorted(int(p) for p in self.gen.choice(idle, min(count, len(idle)), replace=False))
        self.server.args.round_idx = self.version
        out = {}
        for party in chosen:
            payload = self.aggregator.get_model_params_for(party)
            self.server.totals["bytes_down"] += payload_nbytes(payload)
            self.server.totals["params_down"] += payload_numel(payload)
            upload = self.server.uploads.upload_spec(party)
            self.inflight[party] = Job(self.version, payload, spec=spec_shapes(upload))
            if self.clock is not None:
                self.clock.start(party, *self.server.local_round_cost(party, payload, upload))
            out[party] = payload
        return out

    def on_the_clock(self, count: int, idle: list[int]) -> tuple[int, list[int]]:
        """The slots the simulated clock lets fill now, and the idle parties it lets take them: under
        `server_args.arrival_rate` one slot per arrival come since (one finding no free slot or no party
        is lost); under `train_args.availability_file` only parties online now, and a free slot left
        for want of one waits for the next to come online."""
        clock = self.clock
        online = [p for p in idle if clock.online(p)]
        arrivals = clock.take_arrivals()
        if arrivals is not None:
            return min(count, arrivals), online
        if count > len(online) and len(online) < len(idle):
            clock.wake_for([p for p in idle if p not in online])
        return count, online

    # --- the server's side ----------------------------------------------------------------------
    def take(self, party: int, upload: Payload, offline: bool = False) -> bool:
        """`party`'s update arrives: lost when its party went offline before it ended (the clock's
        `lost`, or `offline`: a replay's record says so), refused when too stale or unusable, else
        into the buffer; returns whether the buffer is full. So many updates left out in a row that no
        buffer could fill stop the run (BadUpload)."""
        job = self.inflight.pop(party)
        samples = self.server.weight(party)
        tau = self.version - job.start
        lost = self.went_offline(party) or (OFFLINE if offline else None)
        why = lost or self.too_stale(party, tau) or self.unusable(party, job, upload)
        if why:
            self.left.append([party, job.start, why, len(self.updates)])
            self.left_out += 1
            if self.left_out >= LEFT_OUT_LIMIT * max(self.size, self.concurrency):
                raise BadUpload(
                    f"round {self.version}: {self.left_out} updates in a row left out (too stale: "
                    f"{self.refused_stale}, unusable: {self.rejected}), so no buffer fills"
                )
            return False
        self.left_out = 0
        self.updates.append([party, job.start])
        self.add(party, job, samples, upload, tau)
        return len(self.buffer) >= self.size

    def add(self, party: int, job: Job, samples: float, upload: Payload, tau: int) -> None:
        """Into the buffer: the party's vector under privacy_args, else its discounted addends."""
        s = discount(self.options.staleness, tau, self.options.staleness_exponent)
        keep = (samples, {"metrics": dict(upload.get("metrics") or {})})
        if self.remote:  # its silo holds it: the party's plan, for the buffer's secure sum
            self.plans[party] = [job.start, s]
            self.buffer.add({}, 1.0, tau, keep, party)
            self.shift(party, job, self.server.privacy.ratios[party], s)
            return
        if self.server.privacy is not None:  # the party's side: its clipped, discounted vector
            self.vectors[party] = party_vector(upload, job.payload, self.server.privacy.plan(party, s))
            self.buffer.add({}, 1.0, tau, keep, party)
            self.shift(party, job, self.server.privacy.ratios[party], s)
            return
        self.server.totals["bytes_up"] += payload_nbytes(upload)
        self.server.totals["params_up"] += payload_numel(upload)
        if self.server.save_party_models:
            self.server.save_uploads({party: upload})
        algorithm = self.aggregator.algorithm
        ratio = float(algorithm.sum_weight(samples)) if self.options.buffer_weights == "samples" else 1.0
        if self.options.buffered_rule == "fedasync":  # Xie et al.: mixed into the current model, alpha s
            current = self.aggregator.get_model_params_for(party)
            addends = contribution(upload, current, algorithm.summed, ratio * s * self.options.fedasync_alpha)
            self.buffer.add(addends, ratio, tau, keep, party)
            return
        addends = contribution(upload, job.payload, algorithm.summed, ratio * s)
        self.buffer.add(addends, ratio, tau, keep, party)
        self.shift(party, job, ratio, s)

    def stat_keys(self) -> list[str]:
        """The model's running statistics (floating-point entries that are not trainable: BatchNorm's
        running_mean and running_var) where the algorithm sums its model as an update; none where the
        trainable entries are not known."""
        algorithm = self.aggregator.algorithm
        if algorithm.summed.get("model") != UPDATE or not algorithm.trainable:
            return []
        state, trainable = self.aggregator.global_state, set(algorithm.trainable)
        return [k for k, v in state.items() if v.is_floating_point() and k not in trainable]

    def shift(self, party: int, job: Job, ratio: float, s: float) -> None:
        """Keep r s (x_sent - x) of the party's running statistics, for `core.fedbuff.restate`: its
        statistics are mixed into the current model's rather than applied as a change from a stale one
        (a stale change can take a variance below zero)."""
        keys, sent = self.stat_keys(), job.payload.get("model")
        if keys and isinstance(sent, dict):
            current = self.aggregator.global_state
            shift = stat_shift(sent, current, keys, float(ratio) * s)
            self.buffer.shifts.append((party, float(ratio), shift))

    def unbuffer(self, parties: list[int], why: str) -> None:
        """`remote`: take `parties`' updates out of the buffer before its secure sum (their silos
        hold them no more, or left its session before anyone masked): left out, `why`; the buffer
        fills again and the parties take work. So many taken out since the last buffer applied that
        no buffer could fill stop the run (BadUpload)."""
        self.unbuffered += len(parties)
        if self.unbuffered >= LEFT_OUT_LIMIT * max(self.size, self.concurrency):
            raise BadUpload(
                f"round {self.version}: {self.unbuffered} updates taken out of the buffer before its secure "
                f"sum since the last one applied ({why}: parties {sorted(parties)[:10]}), so no buffer fills"
            )
        for party in parties:
            self.buffer.remove(party)
            start, _ = self.plans.pop(party)
            self.updates.remove([party, start])
            self.left.append([party, start, why, len(self.updates)])

    def went_offline(self, party: int) -> str | None:
        """`train_args.availability_file`: a round its party could not finish online is lost."""
        if self.clock is None or party not in self.clock.lost:
            return None
        self.clock.lost.discard(party)
        return OFFLINE

    def too_stale(self, party: int, tau: int) -> str | None:
        """`server_args.max_staleness`: an update staler is refused, counted and logged."""
        limit = self.options.max_staleness
        if limit is None or tau <= limit:
            return None
        self.refused_stale += 1
        log.warning(
            "round %d: party %d's update is %d rounds stale (max_staleness %d): refused",
            self.version,
            party,
            tau,
            limit,
        )
        return f"{tau} rounds stale"

    def unusable(self, party: int, job: Job, upload: Payload) -> str | None:
        """The server's checks of an upload (`engine.uploads`) against what the party was sent; of one
        its silo holds (`remote`), that its task asked for what this version sums (the party checks
        its upload itself: one it cannot add leaves the secure sum)."""
        self.server.sent = {party: job.payload}
        if self.remote:
            now = spec_shapes(self.server.uploads.upload_spec(party))
            why = None if job.spec is None or job.spec == now else "its task's upload is not this version's"
        else:
            why = self.server.uploads.upload_problem(party, upload)
        if why is None:
            return None
        log.error("round %d: party %d's upload is left out: %s", self.version, party, why)
        self.rejected[party] = why
        if self.server.on_bad_upload == "stop":
            raise BadUpload(f"round {self.version}: {self.rejected} (train_args.on_bad_upload: stop)")
        return "unusable"

    def restate(self, sums: Sums, parties: list[int] | None) -> None:
        """The buffer's running statistics in `sums` measured against the current model (`shift`)."""
        model = sums.fields.get("model") if sums.fields else None
        if self.buffer.shifts and isinstance(model, dict):
            held = [x for x in self.buffer.shifts if parties is None or x[0] in parties]
            restate(model, sums.weight, held)

    def releasable(self) -> bool:
        """Whether the full buffer's sum may be released: not when it would pass
        `privacy_args.dp_target_epsilon` (logged; the run stops before it)."""
        privacy = self.server.privacy
        if privacy is None or privacy.allows(sorted({**self.vectors, **self.plans})):
            return True
        log.warning(
            "privacy_args.dp_target_epsilon: the run stops after %d rounds: the next buffer's sum "
            "would pass epsilon %s; it is not released",
            self.version,
            privacy.options.dp_target_epsilon,
        )
        return False

    def apply(
        self, summed: Sums | None = None, parties: list[int] | None = None
    ) -> tuple[int, list[Result], dict[str, Any]] | None:
        """Apply the full buffer (one round): (its round, what its record keeps of the parties, the
        record's buffered fields); the caller evaluates and records it. Under privacy_args its
        parties' vectors are summed (securely, with DP's noise and accounting), or, `remote`, their
        sum is `summed` (its parties' secure sum over the network), unless the release would pass
        `dp_target_epsilon` (`releasable`): then None, the buffer unreleased (the run stops).
        `parties`: those `summed` holds (a secure sum's survivors; None: the whole buffer). Running
        statistics are restated against the current model (`core.fedbuff.restate`)."""
        buffer, round_idx, privacy = self.buffer, self.version, self.server.privacy
        self.server.rejected = dict(self.rejected)
        if summed is None and not self.releasable():
            return None
        if privacy is not None:
            sums = summed if summed is not None else self.server.summing.private_sum(round_idx, self.vectors)
            self.restate(sums, parties)
            self.vectors, self.plans = {}, {}
            ordered = self.server.summing.apply_sums(sums)
        else:
            sums = Sums(buffer.weight, len(buffer), buffer.fields)
            self.restate(sums, None)
            ordered = self.server.summing.apply_sums(sums, [keep for _, keep in buffer.kept])
        extra: dict[str, Any] = {**buffer.stats(), "refused_stale": self.refused_stale}
        if self.clock is not None:
            extra["sim_time_s"] = self.clock.now
        extra.update(updates=self.updates, left_out=self.left)
        self.server.args.round_idx = round_idx
        self.version += 1
        self.buffer, self.refused_stale, self.rejected, self.unbuffered = Buffer(), 0, {}, 0
        self.updates, self.left = [], []
        self.server.started = time.perf_counter()
        return round_idx, ordered, extra
