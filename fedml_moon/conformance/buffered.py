"""Buffered aggregation (`server_args.aggregation: buffered`) tried on an algorithm, inside this
process, two ways.

Every party at once, fresh: with K = concurrency = every party of the run, equal (constant)
speeds and `buffer_weights: samples`, every slot frees at the same instant, the buffer holds exactly
the round's uploads and every discount is 1, so the algorithm's `aggregate_sums` of the buffer must
make what its `aggregate` makes of the synchronous round's uploads. Over two rounds (the second
trains from what the first made) the two runs end with the same model and server algorithm state
(within BUFFERED_ATOL: float64 sums against float32 means) and record the same training loss.

Stale: every party at once, equal speeds, a buffer of one update: every arrival of the first instant
is applied alone, the second one round stale, the third two, and so on; the run must end with a
finite model and finite metrics, each round applying one update that is as stale as its round.

An algorithm `buffering.buffer_refusal` refuses (it sums nothing, or sets `not_buffered`) is not
tried: the check is not applicable, with the reason.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedml_moon.conformance.inprocess import quiet_run
from fedml_moon.conformance.paths import Outcome
from fedml_moon.conformance.snapshot import differences, snapshot
from fedml_moon.errors import ConfigError
from fedml_moon.run_folder import read_records

BUFFERED_ATOL = 1e-5  # the buffered round against the synchronous one (float64 sums, float32 means)
NAMES = ("synchronous", "buffered")
BUFFERED = "buffered aggregation: every party at once equals the synchronous round; stale updates run"


def _whole_run(config: str | Path, overrides: list[str], folder: Path) -> tuple[dict, dict, list[dict]]:
    """A whole run in this process: the final global state's and the server algorithm's snapshots,
    and the records of metrics.jsonl."""
    with quiet_run(config, overrides, folder) as run:
        run.loop.run()
        aggregator = run.loop.server.aggregator
        final, server = snapshot(aggregator.global_state), snapshot(aggregator.algorithm)
    return final, server, read_records(folder)


def _failed(what: str, err: Exception) -> Outcome:
    """A buffered run that stopped: a config refusal (the sum form, a clash) or the algorithm's error."""
    if isinstance(err, ConfigError):
        return Outcome(error=f"buffered aggregation refuses this algorithm or config: {err}")
    return Outcome(error=f"the {what} run failed: {type(err).__name__}: {err}")


def loss_differences(sync: list[dict], buffered: list[dict]) -> list[str]:
    """Rounds whose training loss differs beyond 1e-4 between the two runs, or a different count."""
    if len(sync) != len(buffered):
        return [f"{len(sync)} synchronous rounds recorded, {len(buffered)} buffered"]
    found = []
    for a, b in zip(sync, buffered, strict=True):
        x, y = a.get("train_loss"), b.get("train_loss")
        if x != y and not (isinstance(x, float) and isinstance(y, float) and abs(x - y) <= 1e-4):
            found.append(f"round {a['round']} train_loss: synchronous {x}, buffered {y}")
    return found


def stale_problems(records: list[dict], final: dict, rounds: int) -> list[str]:
    """What is wrong with the stale run: rounds missing, a round that did not apply one update as
    stale as its round, a metric or a model entry that is not finite."""
    if len(records) != rounds:
        return [f"the stale run recorded {len(records)} rounds, not {rounds}"]
    found = [
        f"round {r['round']} {key}: {value}"
        for r in records
        for key, value in r.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]
    seen = [(r.get("parties"), r.get("staleness_max")) for r in records]
    if seen != [(1, r) for r in range(rounds)]:
        found.append(f"(updates, staleness) by round {seen}, not one update of staleness 0, 1, ... each")
    found += [f"final model.{d}" for d in _not_finite(final)]
    return found


def _not_finite(tree: Any, where: str = "") -> list[str]:
    """The tensors of a snapshot that hold NaN or infinity, by name."""
    if isinstance(tree, dict):
        return [d for k, v in tree.items() for d in _not_finite(v, f"{where}.{k}" if where else str(k))]
    is_float = hasattr(tree, "is_floating_point") and tree.is_floating_point()
    if is_float and not bool(tree.isfinite().all()):
        return [f"{where}: not finite"]
    return []


def buffered_vs_sync(config: str | Path, overrides: list[str], folder: Path, parties: int) -> Outcome:
    """The module docstring's two runs, `parties` the run's client_num_in_total; the synchronous
    reference samples every party every round."""
    from fedml_moon.config.buffered import buffer_refusal
    from fedml_moon.config.load import load_config
    from fedml_moon.registry import get_algorithm

    common = [*overrides, f"train_args.client_num_per_round={parties}", "validation_args.local_test=false"]
    common += ["train_args.party_speed=constant", "server_args.aggregation=sync"]
    spec = get_algorithm(load_config(config, common).train_args.algorithm)
    why = buffer_refusal(spec.server, spec.name)
    if why:
        return Outcome(skipped=why)
    buffered = [*common, "server_args.aggregation=buffered", f"server_args.concurrency={parties}"]
    buffered.append("server_args.max_staleness=null")  # every update is applied, however stale
    two = "train_args.comm_round=2"  # the second round trains from what the first's sums made
    try:
        sync_final, sync_server, sync_records = _whole_run(config, [*common, two], folder / "sync")
    except Exception as err:  # the synchronous reference, every party sampled
        return Outcome(error=f"the synchronous run of every party failed: {type(err).__name__}: {err}")
    fresh = [*buffered, two, f"server_args.buffer_size={parties}", "server_args.buffer_weights=samples"]
    try:
        final, server, records = _whole_run(config, fresh, folder / "buffered")
    except Exception as err:
        return _failed("buffered", err)
    found = differences(sync_server, server, "server algorithm", BUFFERED_ATOL, NAMES)[:3]  # the cause
    found += differences(sync_final, final, "final model", BUFFERED_ATOL, NAMES)[:3]
    found += loss_differences(sync_records, records)[:3]
    if found:
        return Outcome(found, note="every party at once, no staleness")
    stale = [*buffered, "server_args.buffer_size=1", f"train_args.comm_round={parties}"]
    try:
        final, _, records = _whole_run(config, stale, folder / "stale")
    except Exception as err:
        return _failed("stale buffered", err)
    found = [f"stale run: {p}" for p in stale_problems(records, final, parties)]
    note = f"within {BUFFERED_ATOL:g}; then {parties} updates of staleness 0 to {parties - 1}, one a round"
    return Outcome(found, note=note)
