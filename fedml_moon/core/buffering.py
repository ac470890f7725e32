"""FedBuff's constants (the choices of `server_args.aggregation`, `buffer_weights`, `staleness` and
`train_args.party_speed`), a buffered run's shape and the checks of each key on its own; the math is
`core/fedbuff.py` and the clock `core/sim_clock.py`, the checks against the rest of the config
`config/buffered.py`, the loop `engine/buffered.py`. Importing it costs nothing (no torch)."""

from __future__ import annotations

from typing import Any

from fedml_moon.errors import require

AGGREGATIONS = ("sync", "buffered")
BUFFER_WEIGHTS = ("uniform", "samples")
BUFFERED_RULES = ("fedbuff", "fedasync")  # engine.buffer_rounds: what an update is measured against
STALENESS = ("sqrt", "polynomial", "constant")  # core.fedbuff.discount
PARTY_SPEEDS = ("constant", "lognormal", "halfnormal", "exponential", "uniform", "file")  # core.sim_clock
SPEED_DRAWS = ("party", "round")


def buffer_shape(cfg: Any) -> tuple[int, int]:
    """(concurrency, K) of a buffered run, their nulls resolved: concurrency defaults to
    `train_args.client_num_per_round`, K (`buffer_size`) to the concurrency (FedAsync's to 1)."""
    s = cfg.server_args
    concurrency = s.concurrency or cfg.train_args.client_num_per_round
    return concurrency, s.buffer_size or (1 if s.buffered_rule == "fedasync" else concurrency)


def speed_value_checks(train: Any) -> None:
    """`train_args.party_speed` and its keys (`TrainArgs.check`)."""
    speed = train.party_speed
    require(
        speed is None or speed in PARTY_SPEEDS,
        "train_args.party_speed",
        f"{speed!r} is unknown; choose one of {', '.join(PARTY_SPEEDS)}, or null (no simulated clock)",
    )
    require(train.party_speed_sigma > 0, "train_args.party_speed_sigma", "must be > 0")
    require(train.party_speed_mean > 0, "train_args.party_speed_mean", "must be > 0")
    require(train.party_speed_min >= 0, "train_args.party_speed_min", "must be >= 0")
    require(
        speed != "uniform" or train.party_speed_min < train.party_speed_mean,
        "train_args.party_speed_min",
        f"uniform draws from [min, 2 mean - min]: the min ({train.party_speed_min}) must be below the mean "
        f"({train.party_speed_mean})",
    )
    require(
        train.party_speed_draw in SPEED_DRAWS,
        "train_args.party_speed_draw",
        f"{train.party_speed_draw!r}: choose party (once per party) or round (afresh each local round)",
    )
    require(train.secure_session_s >= 0, "train_args.secure_session_s", "must be >= 0")
    require(
        train.bandwidth_mbps is None or train.bandwidth_mbps > 0,
        "train_args.bandwidth_mbps",
        "must be > 0 (or null: transfers cost no simulated time)",
    )


def buffer_value_checks(s: Any) -> None:
    """server_args' buffered keys, each on its own (`ServerArgs.check`)."""
    require(
        s.aggregation in AGGREGATIONS,
        "server_args.aggregation",
        f"{s.aggregation!r}: choose sync or buffered",
    )
    require(
        s.staleness in STALENESS,
        "server_args.staleness",
        f"{s.staleness!r}: choose one of {', '.join(STALENESS)}",
    )
    require(s.staleness_exponent >= 0, "server_args.staleness_exponent", "must be >= 0")
    require(
        s.buffer_weights in BUFFER_WEIGHTS,
        "server_args.buffer_weights",
        f"{s.buffer_weights!r}: choose uniform (the paper's 1/K) or samples",
    )
    require(s.buffer_size is None or s.buffer_size >= 1, "server_args.buffer_size", "must be >= 1 (or null)")
    require(
        s.buffered_rule in BUFFERED_RULES,
        "server_args.buffered_rule",
        f"{s.buffered_rule!r}: choose fedbuff (Nguyen et al. 2022) or fedasync (Xie et al. 2019)",
    )
    require(0 < s.fedasync_alpha <= 1, "server_args.fedasync_alpha", "must be in (0, 1]")
    require(
        s.arrival_rate is None or s.arrival_rate > 0,
        "server_args.arrival_rate",
        "must be > 0 (parties a simulated second), or null (a freed slot is filled at once)",
    )
    require(
        s.buffered_rule != "fedasync" or s.buffer_size in (None, 1),
        "server_args.buffer_size",
        f"fedasync mixes each update in as it arrives: set 1 or null; got {s.buffer_size}",
    )
    require(
        s.max_staleness is None or s.max_staleness >= 0, "server_args.max_staleness", "must be >= 0 (or null)"
    )
