"""`privacy_args`: secure aggregation (SecAgg / SecAgg+) and client-level differential privacy
(DP-FedAvg), off by default. The section's keys and their checks against the rest of the config.

What each key does: docs/how-to/privacy.md, docs/explanation/privacy.md; `fedml_moon.privacy.mod` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedml_moon.config.fields import choice
from fedml_moon.core.buffering import buffer_shape
from fedml_moon.errors import require

ACCOUNTANTS = ("rdp", "pld")
DP_BUFFERS = ("refuse", "average")


@dataclass
class PrivacyArgs:
    """Secure aggregation: the server learns only the sum of the sampled parties' uploads. DP: each
    party's update is clipped to `dp_clip_norm` and Gaussian noise of std `dp_noise_multiplier` x
    `dp_clip_norm` is added to the sum; epsilon for `dp_delta` is reported after every round."""

    secure_aggregation: bool = False
    """mask every upload (SecAgg, SecAgg+): the server learns sums only; needs 3 or more parties a round"""
    secagg_threshold: int | str = "auto"
    """t, the shares of a neighbourhood (itself included) that rebuild a secret: auto (a majority) or >= 2"""
    secagg_neighbours: int = 0
    """SecAgg+ degree k of each round's random graph (rounded up to even); 0: every other party (SecAgg)"""
    secagg_min_group: int = 3
    """the fewest parties, a connected set, whose sum may be unmasked; >= 2, at most client_num_per_round"""
    secagg_clip: float = 8.0
    """fixed point: each value is clipped to [-secagg_clip, secagg_clip]; > 0"""
    secagg_bits: int = 22
    """fixed point: the clipped range is rounded to 2^secagg_bits levels; 1 <= bits < secagg_modulus_bits"""
    secagg_modulus_bits: int = 32
    """sums are taken mod 2^k (k <= 32: 4 bytes a value on the wire, else 8); at most 62"""
    dp_clip_norm: float | None = None
    """C: each party's contribution is clipped to L2 norm C (client-level DP, DP-FedAvg); null: no DP; > 0"""
    dp_noise_multiplier: float = 0.0
    """sigma: Gaussian noise of std at least sigma x C on the sum; > 0 with dp_clip_norm, else 0"""
    dp_delta: float = 1e-5
    """delta of the reported (epsilon, delta); in (0, 1)"""
    dp_target_epsilon: float | None = None
    """stop before the round that would take epsilon past this; null: no limit; needs dp_clip_norm"""
    dp_accountant: str = choice("rdp", ACCOUNTANTS)
    """rdp (Renyi DP), or pld (privacy loss distributions: tighter; needs every party in every round)"""
    dp_buffers: str = choice("refuse", DP_BUFFERS)
    """float buffers (BatchNorm statistics) under DP: refuse, or average outside the noised sum"""

    @property
    def dp(self) -> bool:
        return self.dp_clip_norm is not None

    @property
    def on(self) -> bool:
        return self.secure_aggregation or self.dp

    def check(self) -> None:
        t = self.secagg_threshold
        require(
            t == "auto" or (type(t) is int and t >= 2),
            "privacy_args.secagg_threshold",
            f"must be 'auto' (a majority of each neighbourhood) or an integer >= 2 (one share would give "
            f"a secret away); got {t!r}",
        )
        require(self.secagg_neighbours >= 0, "privacy_args.secagg_neighbours", "must be >= 0 (0: all)")
        require(
            type(self.secagg_min_group) is int and self.secagg_min_group >= 2,
            "privacy_args.secagg_min_group",
            f"must be an integer >= 2 (a sum of one party is its input); got {self.secagg_min_group}",
        )
        require(self.secagg_clip > 0, "privacy_args.secagg_clip", f"must be > 0; got {self.secagg_clip}")
        require(
            1 <= self.secagg_bits < self.secagg_modulus_bits <= 62,
            "privacy_args.secagg_bits",
            f"need 1 <= secagg_bits < secagg_modulus_bits <= 62; got {self.secagg_bits} and "
            f"{self.secagg_modulus_bits}",
        )
        self.check_dp()

    def check_dp(self) -> None:
        clip, sigma = self.dp_clip_norm, self.dp_noise_multiplier
        require(clip is None or clip > 0, "privacy_args.dp_clip_norm", f"must be > 0 or null; got {clip}")
        require(sigma >= 0, "privacy_args.dp_noise_multiplier", f"must be >= 0; got {sigma}")
        require(
            clip is None or sigma > 0,
            "privacy_args.dp_noise_multiplier",
            "must be > 0 when dp_clip_norm is set (clipping without noise gives no privacy guarantee)",
        )
        require(
            sigma == 0 or clip is not None,
            "privacy_args.dp_clip_norm",
            "set it (the norm C each update is clipped to): the noise's scale is sigma x C",
        )
        require(0 < self.dp_delta < 1, "privacy_args.dp_delta", f"must be in (0, 1); got {self.dp_delta}")
        target = self.dp_target_epsilon
        require(target is None or target > 0, "privacy_args.dp_target_epsilon", "must be > 0 or null")
        require(
            target is None or clip is not None,
            "privacy_args.dp_target_epsilon",
            "needs DP on (dp_clip_norm and dp_noise_multiplier)",
        )
        require(
            self.dp_accountant in ACCOUNTANTS,
            "privacy_args.dp_accountant",
            f"choose one of {', '.join(ACCOUNTANTS)}",
        )
        require(
            self.dp_buffers in DP_BUFFERS,
            "privacy_args.dp_buffers",
            "refuse (a model with BatchNorm statistics is a config error under DP) or average (they are "
            "averaged outside the clipped, noised sum: epsilon does not cover them)",
        )


def privacy_checks(cfg: Any, server_cls: type, summed: dict[str, str]) -> None:
    """privacy_args against the algorithm, the evaluation and the aggregation rule."""
    p, algorithm = cfg.privacy_args, cfg.train_args.algorithm
    if not p.on:
        return
    key = "privacy_args.secure_aggregation" if p.secure_aggregation else "privacy_args.dp_clip_norm"
    require(
        server_cls.averages and bool(summed),
        key,
        f"{algorithm} sums nothing (each party keeps its own model): there is no sum to protect; turn it off",
    )
    require(
        cfg.server_args.robust_aggregation == "none",
        "server_args.robust_aggregation",
        f"{cfg.server_args.robust_aggregation!r} needs each party's upload, which privacy_args hides from "
        "the server (it sees only their sum); set none",
    )
    train, buffered = cfg.train_args, cfg.server_args.aggregation == "buffered"
    require(
        not buffered or cfg.server_args.buffered_rule != "fedasync",
        "server_args.buffered_rule",
        "fedasync mixes each party's model in alone, measured against the current model the party never "
        "saw, so no sum hides it and no party can clip its own change: set privacy_args off, or use fedbuff",
    )
    require(
        not p.dp
        or p.dp_accountant != "pld"
        or buffered
        or train.client_num_per_round == train.client_num_in_total,
        "privacy_args.dp_accountant",
        "pld composes rounds where every party takes part (client_num_per_round = client_num_in_total); "
        "with sampled parties use rdp",
    )
    if not p.secure_aggregation:
        return
    if buffered:  # each buffer is a secure sum of its K parties
        _crowd_checks(p, buffer_shape(cfg)[1], "server_args.buffer_size")
    else:
        _crowd_checks(p, train.client_num_per_round, "train_args.client_num_per_round")
    require(
        not cfg.validation_args.local_test,
        "validation_args.local_test",
        "each party's own test figures would reach the server in the clear under secure aggregation; "
        "set false (docs/how-to/privacy.md: the metrics then unavailable)",
    )
    require(
        not cfg.train_args.save_party_models,
        "train_args.save_party_models",
        "the server holds no party's model under secure aggregation; set false",
    )
    for key in server_cls.standalone_only(cfg.algorithm_args):
        require(False, key, "needs every party's own model, which secure aggregation hides; turn it off")
    mode = getattr(cfg.algorithm_args, "prototype_mode", "mean")
    require(
        mode != "random-k",
        "algorithm_args.prototype_mode",
        f"{mode!r} picks some parties' prototypes per class, which needs each party's upload; under secure "
        "aggregation use mean (the mean over every party that holds the class)",
    )


def _crowd_checks(p: PrivacyArgs, per_round: int, key: str) -> None:
    """Secure aggregation's crowd rules against the round's size (docs/explanation/privacy.md), the
    setting `key` (client_num_per_round, or a buffered run's buffer_size): at least 3 parties a round,
    a threshold above half of each neighbourhood, a reachable secagg_min_group."""
    require(
        per_round >= 3,
        key,
        f"secure aggregation needs at least 3 parties a round (with 1 the server reads its input, with 2 "
        f"each learns the other's from the sum); got {per_round}: sample 3 or more, or turn "
        "privacy_args.secure_aggregation off",
    )
    from fedml_moon.privacy.secagg_graph import neighbourhood_size  # cryptography: only when secure

    size, t = neighbourhood_size(per_round, p.secagg_neighbours), p.secagg_threshold
    require(
        t == "auto" or 2 * t > size,
        "privacy_args.secagg_threshold",
        f"{t} is not more than half of a neighbourhood of {size} (itself included, from "
        f"{key.split('.')[-1]}={per_round} and secagg_neighbours={p.secagg_neighbours}): a server telling "
        f"some neighbours a party survived and others that it dropped would rebuild both of its secrets; "
        f"set it above {size // 2}, or auto",
    )
    require(
        t == "auto" or t < size,
        "privacy_args.secagg_threshold",
        f"{t} leaves no holder of a neighbourhood of {size} (itself included) out: a party named for bad "
        "shares by its neighbour (whose share of it is then missing) would stop the round; lower it below "
        f"{size}, or raise secagg_neighbours",
    )
    require(
        p.secagg_min_group <= per_round,
        "privacy_args.secagg_min_group",
        f"{p.secagg_min_group} exceeds {key}={per_round}: no round could be "
        "unmasked; lower it or sample more parties",
    )
