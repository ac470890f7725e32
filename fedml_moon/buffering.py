"""The checks of `server_args.aggregation: buffered` (FedBuff) and `train_args.party_speed` against
the rest of the config; the math is `fedml_moon.core.fedbuff`, the loop `engine.buffered`.
Importing it costs nothing (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedml_moon.errors import require

AGGREGATIONS = ("sync", "buffered")
BUFFER_WEIGHTS = ("uniform", "samples")
STALENESS = ("sqrt", "polynomial", "constant")  # core.fedbuff.discount
PARTY_SPEEDS = ("constant", "lognormal", "halfnormal", "file")  # core.fedbuff.party_durations


def buffer_refusal(server: type, name: str) -> str | None:
    """Why the server algorithm `server` (registered as `name`) cannot aggregate in buffers, or None:
    it must declare its sum form (`summed`), and may refuse with a reason of its own (`not_buffered`)."""
    own = getattr(server, "not_buffered", None)
    if own:
        return f"{name} cannot buffer: {own}"
    if not getattr(server, "summed", None):
        return f"{name} sums nothing (each party keeps its own model), so there is no buffer to fill"
    return None


def buffer_shape(cfg: Any) -> tuple[int, int]:
    """(concurrency, K) of a buffered run, their nulls resolved: concurrency defaults to
    `train_args.client_num_per_round`, K (`buffer_size`) to the concurrency."""
    s = cfg.server_args
    concurrency = s.concurrency or cfg.train_args.client_num_per_round
    return concurrency, s.buffer_size or concurrency


def speed_value_checks(train: Any) -> None:
    """`train_args.party_speed` and its sigma (`TrainArgs.check`)."""
    speed = train.party_speed
    require(
        speed is None or speed in PARTY_SPEEDS,
        "train_args.party_speed",
        f"{speed!r} is unknown; choose one of {', '.join(PARTY_SPEEDS)}, or null (no simulated clock)",
    )
    require(train.party_speed_sigma > 0, "train_args.party_speed_sigma", "must be > 0")


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
        s.max_staleness is None or s.max_staleness >= 0, "server_args.max_staleness", "must be >= 0 (or null)"
    )


def buffered_checks(cfg: Any, server: type) -> None:
    """buffered against the mode, the algorithm and the other keys; party_speed's file."""
    s, train = cfg.server_args, cfg.train_args
    if train.party_speed == "file":
        path = train.party_speed_file
        require(
            path is not None and Path(path).expanduser().is_file(),
            "train_args.party_speed_file",
            f"{path!r} is not a file; give a CSV of party,seconds rows (party_speed: file reads it)",
        )
    n = train.client_num_in_total
    require(
        s.concurrency is None or 1 <= s.concurrency <= n,
        "server_args.concurrency",
        f"the parties training at once must be between 1 and client_num_in_total ({n}); got {s.concurrency}",
    )
    simulated = cfg.common_args.training_type == "simulation"
    standalone = simulated and cfg.comm_args.backend == "sp"
    require(
        simulated or train.party_speed is None,
        "train_args.party_speed",
        "the simulated clock runs in the simulations only (standalone, MPI); cross-silo and MQTT + S3 "
        "runs go at the parties' real pace: set it to null",
    )
    require(
        standalone or s.aggregation == "buffered" or train.party_speed is None,
        "train_args.party_speed",
        "a synchronous run keeps the simulated clock in the standalone simulation only (comm_args.backend "
        "sp); set it to null",
    )
    if s.aggregation != "buffered":
        return
    clashes = {
        "train_args.algorithm": buffer_refusal(server, train.algorithm),
        "server_args.robust_aggregation": s.robust_aggregation != "none"
        and "a robust rule compares a round's uploads one by one, a buffer holds their sum",
        "train_args.stream_uploads": train.stream_uploads
        and "a buffer already sums each update as it arrives",
        "algorithm_args.prototype_mode": getattr(cfg.algorithm_args, "prototype_mode", "mean") == "random-k"
        and "random-k picks some parties' prototypes per class, a buffer holds only their sum (use mean)",
    }
    for key, why in clashes.items():
        require(
            not why,
            "server_args.aggregation",
            f"buffered cannot run with this {key}: {why}; set aggregation: sync",
        )
    require(
        not cfg.privacy_args.on or buffer_shape(cfg)[1] <= n,
        "server_args.buffer_size",
        f"under privacy_args a buffer holds at most one update per party, so it cannot hold more than "
        f"client_num_in_total ({n}); got {buffer_shape(cfg)[1]}",
    )
