"""The server's side of `privacy_args`: it wraps a server algorithm's aggregation, never the algorithm.

Each round the server hands every sampled party a `Plan` (what to add to the sum, its weight ratio,
its DP noise share), and gets back one vector: the sum of the parties' vectors, which secure
aggregation reveals and nothing else. `finish` reads the sum back (`privacy.sums`), adds DP's noise
where no party did (secure aggregation off), composes the round in the privacy accountant, and the
server algorithm's `aggregate_sums` makes the new global state.

The standalone simulation runs the parties' and the server's sides of the protocol in this process
(`secure_sum`); the distributed modes carry its messages (`fedml_moon.distributed`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path

import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.errors import ConfigError
from fedml_moon.privacy.dp import gaussian_noise, noise_std
from fedml_moon.privacy.ledger import PrivacyLedger
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.party import CLEAR, PartyVector, Plan, warn_out_of_range
from fedml_moon.privacy.secagg import PartySession, SecAggError, SecAggParams, ServerSession
from fedml_moon.privacy.secagg_graph import neighbourhood_size, round_problem
from fedml_moon.privacy.sums import Entry, Sums, unflatten

log = logging.getLogger(__name__)


class PrivateAggregation:
    """One run's privacy_args on the server: plans, the secure-aggregation parameters, the accountant.

    DP clips and noises the model's trainable parameters (and what else the algorithm sums: SCAFFOLD's
    delta_c, FedSSC's prototypes), never its integer counters, which no private sum carries (their
    global value stays the server's), and its float buffers (BatchNorm's running statistics) only as
    `privacy_args.dp_buffers` says: `refuse` (a config error) or `average` (summed outside the clipped
    and noised part: epsilon does not cover them). Under secure aggregation with DP each party's noise
    share is sized for the fewest parties a round may complete with (`quorum`), and no round is
    unmasked with fewer, so the sum always carries at least the accounted noise."""

    def __init__(
        self,
        options: PrivacyArgs,
        summed: dict[str, str],
        weights: Mapping[int, float],
        per_round: int,
        samples: Mapping[int, int] | None = None,
        quorum: int | None = None,
        metrics: tuple[str, ...] = ("loss",),
        buffered: bool = False,
    ):
        """`weights`: each party's `sum_weight` (every party of the run); `per_round`: parties sampled
        (buffered: the buffer's K); `samples`: each party's sample count, its metrics' weight (default:
        `weights`); `quorum`: the fewest parties a round may complete with (default: every sampled
        party); `metrics`: the training metrics every party's vector ends with (`loss` and the
        algorithm's terms); `buffered`: the rounds are buffers (FedBuff), whose parties are the first to
        finish, not a uniform sample: the accountant claims no amplification by sampling for them."""
        self.options, self.summed, self.per_round = options, dict(summed), per_round
        self.scope: dict | None = None  # what the epsilons cover and against whom (`privacy/scope.py`)
        self.buffered = buffered
        self.metrics = tuple(sorted(set(metrics)))
        self.quorum = min(per_round, quorum or per_round)
        top = max(weights.values())
        self.ratios = {int(p): 1.0 if options.dp else float(w) / top for p, w in weights.items()}
        samples = samples or weights
        most = max(samples.values())
        self.metric_ratios = {int(p): float(n) / most for p, n in samples.items()}
        self.encoding = FixedPoint(options.secagg_clip, options.secagg_bits, options.secagg_modulus_bits)
        self.left_out: tuple[str, ...] = ()
        self.clear: tuple[str, ...] = ()
        self.ledger: PrivacyLedger | None = None
        self.accountant = None
        if options.dp:
            from fedml_moon.privacy.accountant import PrivacyAccountant  # dp-accounting: only with DP

            sampled = len(weights) if buffered else per_round  # every party: no amplification
            self.accountant = PrivacyAccountant(
                options.dp_noise_multiplier, len(weights), sampled, options.dp_delta, options.dp_accountant
            )

    @property
    def noise_shared(self) -> bool:
        """Whether the parties add the noise (DP under secure aggregation) rather than the server."""
        return self.options.dp and self.options.secure_aggregation

    def set_model(self, trainable: list[str], state: Mapping[str, torch.Tensor]) -> None:
        """Which entries of the model no sum carries (integer counters) and which DP sums in the clear
        (float buffers, with dp_buffers: average); a ConfigError for buffers under dp_buffers: refuse."""
        self.left_out = tuple(k for k, v in state.items() if not v.is_floating_point())
        buffers = tuple(k for k, v in state.items() if v.is_floating_point() and k not in trainable)
        if not (self.options.dp and buffers):
            return
        if self.options.dp_buffers == "refuse":
            raise ConfigError(
                f"privacy_args.dp_buffers: the model has {len(buffers)} float buffers "
                f"({', '.join(buffers[:3])}...: BatchNorm's running statistics, computed from the parties' "
                "data), which DP's clipped, "
                "noised sum does not cover; set dp_buffers: average to average them outside it (epsilon "
                "then holds for the trainable parameters only), or use a model without BatchNorm"
            )
        self.clear = buffers

    def plan(self, party: int, discount: float = 1.0) -> Plan:
        """What `party` adds this round. With DP under secure aggregation every sampled party adds
        N(0, sigma^2 C^2 / q), q the round's quorum, so that a sum of q or more carries at least
        N(0, sigma^2 C^2); it reveals no share for a sum of fewer (`min_sum`). `discount`: buffered
        aggregation's s(tau) of the party's update, applied after clipping (its norm stays <= C)."""
        o = self.options
        share = noise_std(o.dp_clip_norm, o.dp_noise_multiplier, self.quorum) if self.noise_shared else 0.0
        ratios = self.ratios[int(party)], self.metric_ratios[int(party)]
        fewest = self.quorum if self.noise_shared else 0
        return Plan(
            self.summed,
            ratios[0],
            o.dp_clip_norm,
            share,
            o.secure_aggregation,
            ratios[1],
            self.left_out,
            self.clear,
            fewest,
            self.metrics,
            discount,
        )

    def params(self, participants: int) -> SecAggParams:
        """t, the SecAgg+ degree and the crowd size for a round of `participants` parties
        (`secagg_params`), no sum of fewer than the noise quorum unmasked under DP."""
        params = secagg_params(self.options, participants)
        if not self.noise_shared or params.min_group >= self.quorum:
            return params
        return dataclasses.replace(params, min_group=self.quorum)

    def rounds_allowed(self, rounds: int, schedule: list[list[int]]) -> int:
        """How many of `rounds` (sampled as `schedule` says) the run may train before the epsilon that
        `dp_target_epsilon` bounds would pass it: against the server under secure aggregation (the
        strongest observer DP holds against), of the release otherwise."""
        if self.accountant is None or self.options.dp_target_epsilon is None or self.buffered:
            return rounds  # buffered: each buffer is checked as it fills (`allows`)
        target, server = self.options.dp_target_epsilon, self.options.secure_aggregation
        return self.accountant.rounds_within(target, schedule[:rounds], server)

    def allows(self, parties: list[int]) -> bool:
        """Whether one more sum of `parties` at the run's sigma keeps the epsilon that
        `dp_target_epsilon` bounds within it (buffered aggregation asks before each buffer)."""
        if self.accountant is None or self.options.dp_target_epsilon is None:
            return True
        target, server = self.options.dp_target_epsilon, self.options.secure_aggregation
        return self.accountant.rounds_within(target, [parties], server) == 1

    def finish(
        self,
        total: torch.Tensor,
        entries: list[Entry],
        metric_names: list[str],
        parties: list[int],
        round_idx: int | None = None,
    ) -> Sums:
        """The round's `Sums` from the sum of `parties`' vectors (float64): DP's noise on the clipped
        part where no party added it, the clear part rescaled to a mean over the parties summed, the
        release composed in the accountant with the noise the sum carries, and written to the ledger."""
        o, total = self.options, total.clone()
        clipped = sum(int(torch.Size(shape).numel()) for f, _, shape in entries if f != CLEAR)
        if o.dp and not o.secure_aggregation:  # the server adds all of the noise
            total[:clipped] += gaussian_noise(
                total[:clipped], noise_std(o.dp_clip_norm, o.dp_noise_multiplier)
            )
        fields, metric_sums = unflatten(total, entries, metric_names)
        metric_total = sum(self.metric_ratios[p] for p in parties)
        metrics = {k: v / metric_total for k, v in metric_sums.items()}
        ratio_total = sum(self.ratios[p] for p in parties)
        weight = float(self.per_round) if o.dp else ratio_total  # DP-FedAvg: a fixed denominator
        clear = fields.pop(CLEAR, {})
        fields["model"] = {
            **fields.get("model", {}),
            **{k: v * weight / ratio_total for k, v in clear.items()},
        }
        if self.accountant is not None:
            share = len(parties) / self.quorum if self.noise_shared else 1.0  # k shares of sigma^2 / q
            sigma = o.dp_noise_multiplier * math.sqrt(share)
            self.accountant.record(parties, sigma)
            if self.ledger is not None:
                self.ledger.append(round_idx, sigma, parties)
        return Sums(weight, len(parties), fields, metrics)

    def record_fields(self) -> dict:
        """What the server writes into the round's record of the run's privacy (the parties' metrics
        never carry it): with DP, epsilon for delta so far for the release and, under secure
        aggregation, against the server (DP alone holds nothing against a server that sees uploads);
        `dp_epsilon_sample_known`, each party's loss composed over the rounds it was summed in, holds
        against anyone who knows the sample (`privacy/scope.py`)."""
        if self.accountant is None:
            return {}
        out = {
            "dp_epsilon_release": self.accountant.epsilon_release(),
            "dp_epsilon_sample_known": self.accountant.epsilon_server(),  # no amplification by sampling
        }
        if self.options.secure_aggregation:
            out["dp_epsilon_server"] = self.accountant.epsilon_server()
        return out

    def word_bytes(self) -> int:
        """Bytes per value of a masked vector on the wire (int32 up to k = 32, else int64); 8 without
        secure aggregation (the float64 vector)."""
        if not self.options.secure_aggregation:
            return 8
        return 4 if self.options.secagg_modulus_bits <= 32 else 8

    def summary(self) -> dict:
        """What summary.json says of the run's privacy: the epsilons for delta after the rounds trained
        (`dp_epsilon_server` null under DP alone: the server sees every upload) and, with DP, what they
        cover and against whom (`dp_scope`, `privacy/scope.py`)."""
        out: dict = {"secure_aggregation": self.options.secure_aggregation}
        if self.accountant is not None:
            out.update(self.record_fields(), dp_delta=self.options.dp_delta)
            out.setdefault("dp_epsilon_server", None)
            out["dp_scope"] = self.scope
        return out

    def state(self) -> dict:
        return {"accountant": None if self.accountant is None else self.accountant.state()}

    def load_state(self, state: Mapping) -> None:
        """Restore `state()`; with a ledger (`set_ledger`) the accountant is the ledger's: every sum
        released before a crash, those of rounds after the checkpoint included (computed again, they
        are released again and charged again)."""
        if self.accountant is None or state.get("accountant") is None:
            return
        self.accountant.load_state(state["accountant"])
        released = self.ledger.read() if self.ledger is not None else []
        checkpointed = [(sigma, list(ids)) for sigma, ids in self.accountant.history]
        if len(released) > len(checkpointed) and released[: len(checkpointed)] == checkpointed:
            log.warning(
                "privacy: %d sums were released after the checkpoint (rounds computed again now): they "
                "are charged as released, and again as computed anew",
                len(released) - len(checkpointed),
            )
            self.accountant.load_state({**self.accountant.state(), "history": [[s, i] for s, i in released]})

    def set_ledger(self, path: Path) -> None:
        """Write every release to `path` (privacy_ledger.jsonl in the run's folder); DP only."""
        if self.accountant is not None:
            self.ledger = PrivacyLedger(path)


def secagg_params(options: PrivacyArgs, participants: int) -> SecAggParams:
    """t, the SecAgg+ degree and the crowd size for a round of `participants` parties: t auto is a
    majority of each party's neighbourhood and itself, an explicit t must be more than half of it. A
    SecAggError (naming the key) for a round below the crowd rules (`secagg_graph.round_problem`:
    fewer than 3 participants, t <= half a neighbourhood)."""
    size = neighbourhood_size(participants, options.secagg_neighbours)
    t = size // 2 + 1 if options.secagg_threshold == "auto" else int(options.secagg_threshold)
    encoding = FixedPoint(options.secagg_clip, options.secagg_bits, options.secagg_modulus_bits)
    params = SecAggParams(
        threshold=max(t, 1),
        neighbours=options.secagg_neighbours,
        encoding=encoding,
        min_group=options.secagg_min_group,
    )
    problem = round_problem(participants, size, params)
    if problem is not None:
        raise SecAggError(f"secure aggregation among {participants} parties: {problem}")
    return params


def secure_sum(
    round_idx: int,
    vectors: Mapping[int, PartyVector],
    params: SecAggParams,
    drop: frozenset[int] = frozenset(),
) -> tuple[torch.Tensor, list[int]]:
    """SecAgg(+) among `vectors`' parties run in this process (the standalone simulation): every step
    of Bonawitz et al. 2017, Fig. 4, on the round's random graph (Bell et al. 2020), with the parties
    in `drop` leaving after their masked input (their self-masks are removed with the survivors'
    shares) and the crowd rules of the distributed modes: a round below them raises a SecAggError
    naming the reason, nothing revealed. Returns the decoded float64 sum of the survivors' vectors
    and the survivors."""
    parties = sorted(vectors)
    if not parties:
        raise SecAggError(f"round {round_idx}: secure aggregation among no parties: there is no sum")
    length = vectors[parties[0]].vector.numel()
    sessions = {p: PartySession(p, round_idx, params) for p in parties}
    server = ServerSession(round_idx, params, length)
    rosters, digests = server.collect_keys({p: s.advertise() for p, s in sessions.items()})
    inboxes = server.route({p: sessions[p].share(rosters[p], digests) for p in parties})
    for p in parties:
        warn_out_of_range(vectors[p].vector, params.encoding.clip, p)
    masked = {p: sessions[p].mask(vectors[p].vector, inboxes.get(p, {})) for p in parties}
    server.collect_masked(masked, {p: sessions[p].accused for p in parties})
    survivors, dropped = server.unmask_request()
    responses = {p: sessions[p].unmask(survivors, dropped) for p in server.asked if p not in drop}
    total = server.unmask(responses)
    return server.decode(total), list(survivors)
