"""The checks of `server_args.aggregation: buffered` (FedBuff) and `train_args.party_speed` against
the mode, the algorithm and the rest of the config (each key on its own: `core/buffering.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedml_moon.core.buffering import buffer_shape
from fedml_moon.errors import require


def buffer_refusal(server: type, name: str) -> str | None:
    """Why the server algorithm `server` (registered as `name`) cannot aggregate in buffers, or None:
    it must declare its sum form (`summed`), and may refuse with a reason of its own (`not_buffered`)."""
    if server.not_buffered:
        return f"{name} cannot buffer: {server.not_buffered}"
    if not server.summed:
        return f"{name} sums nothing (each party keeps its own model), so there is no buffer to fill"
    return None


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
    path = train.availability_file
    require(
        path is None or Path(path).expanduser().is_file(),
        "train_args.availability_file",
        f"{path!r} is not a file; give a CSV of party,start,end rows (each party's online windows)",
    )
    for key, value in (("train_args.availability_file", path), ("server_args.arrival_rate", s.arrival_rate)):
        require(
            value is None or (s.aggregation == "buffered" and cfg.common_args.training_type == "simulation"),
            key,
            "the simulated clock gives work by it in buffered runs of the simulations (standalone, MPI) "
            "only: set server_args.aggregation: buffered, or set it to null",
        )
    require(
        train.secure_session_s == 0 or cfg.privacy_args.secure_aggregation,
        "train_args.secure_session_s",
        "charges a secure sum's session: set privacy_args.secure_aggregation: true, or set it to 0",
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
