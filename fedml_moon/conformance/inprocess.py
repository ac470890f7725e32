"""Standalone runs inside this process, watched from both sides: what the server holds at each
round's start, every payload, and each local round trained a second way from the same inputs.

`traced_run` is the suite's reference run: it checks that payloads are tensors and JSON values,
takes a `snapshot` of the server's and the party side's algorithm objects at the start of every
round, and trains every round's parties a second time stacked (`parties_in_parallel`) from the very
inputs the sequential path had (downloads, party states, data streams), comparing the two per
party and per tensor; then it puts the sequential results back, so the run goes on as if alone.
Around every local round and server step it fingerprints the algorithm's module globals and class
attributes (`kept.watch`), naming what changed.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedml_moon.conformance.causes import received_changed
from fedml_moon.conformance.kept import watch
from fedml_moon.conformance.snapshot import differences, same_tree, snapshot

FLOAT32_ONE_ROUND = 1e-5  # stacked vs sequential, one local round from identical inputs (float32)
FLOAT64_ROUNDS = 1e-9  # stacked vs sequential over every round, the whole run in float64
STACKED = ("sequential", "stacked")


@dataclass
class Traced:
    """What `traced_run` saw: the run's folder, payload problems, the algorithm objects at each
    round's start, the stacked replays' differences, and the size of every stacked group."""

    folder: Path
    problems: list[str] = field(default_factory=list)
    snapshots: dict[int, dict] = field(default_factory=dict)
    replay: list[str] = field(default_factory=list)
    together: list[int] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # what a party's round changed of what it received
    kept: list[str] = field(default_factory=list)  # module globals / class attributes the run changed
    error: str = ""  # the run stopped: why
    exception: Exception | None = None  # what stopped it


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The package's and FedML's INFO logging held back; PyTorch's default dtype (fp64 changes it)
    and the log levels restored after."""
    loggers, dtype = [logging.getLogger("fedml_moon"), logging.getLogger()], torch.get_default_dtype()
    levels = [logger.level for logger in loggers]
    for logger in loggers:  # the package's INFO lines and FedML's (on the root logger)
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        torch.set_default_dtype(dtype)


@contextlib.contextmanager
def quiet_run(config: str | Path, overrides: list[str], folder: Path) -> Iterator[Any]:
    """A standalone run assembled in this process (`adapters.run.assemble`), held `quiet`."""
    from fedml_moon.adapters.run import assemble
    from fedml_moon.config.load import load_config

    with quiet():
        yield assemble(load_config(config, overrides), folder)


def quiet_base(config: str | Path, overrides: list[str], folder: Path) -> Any:
    """`adapters.run.build_base` of the config (data, partition, first model), held `quiet`."""
    from fedml_moon.adapters.run import build_base
    from fedml_moon.config.load import load_config

    with quiet():
        return build_base(load_config(config, overrides), folder)


def algorithm_objects(run: Any) -> dict[str, Any]:
    """The snapshots of a run's server and party algorithm objects (`snapshot`)."""
    return {
        "server": snapshot(run.loop.server.aggregator.algorithm),
        "party": snapshot(run.loop.runner.trainer.algorithm),
    }


@contextlib.contextmanager
def counting_groups(sizes: list[int]) -> Iterator[None]:
    """Record the size of every group of parties the batched engine trains stacked."""
    from fedml_moon.engine import batched

    original = batched.train_group

    def counted(algorithm: Any, model: Any, group: list, device: Any) -> None:
        sizes.append(len(group))
        original(algorithm, model, group, device)

    batched.train_group = counted
    try:
        yield
    finally:
        batched.train_group = original


def _payload_check(problems: list[str]) -> Any:
    from fedml_moon.core.codec import decode, encode

    def check(obj: object, where: str) -> None:
        try:
            if not same_tree(obj, decode(encode(obj)), atol=0.0):
                problems.append(f"{where}: changes when encoded and decoded")
        except (TypeError, ValueError) as err:
            problems.append(f"{where}: {err}")

    return check


def _watch_payloads(run: Any, traced: Traced) -> None:
    server, runner = run.loop.server, run.loop.runner
    check = _payload_check(traced.problems)
    downloads, train, evaluate = server.downloads, runner.train, runner.evaluate

    def watched_downloads(r: int) -> dict:
        traced.snapshots[r] = algorithm_objects(run)
        out = downloads(r)
        for party, payload in out.items():
            check(payload, f"round {r}: the server's payload for party {party}")
        return out

    def watched_train(party: int, download: dict, r: int) -> tuple:
        before = snapshot(download)
        n, upload = train(party, download, r)
        traced.changed += received_changed(before, download, f"round {r}, party {party}")
        check(upload, f"round {r}: party {party}'s upload")
        check(runner.trainer.store.get(party), f"round {r}: party {party}'s state")
        return n, upload

    def watched_evaluate(party: int, download: dict) -> dict:
        report = evaluate(party, download)
        check(report, f"party {party}'s evaluation report")
        return report

    server.downloads, runner.train, runner.evaluate = watched_downloads, watched_train, watched_evaluate


def _held(runner: Any, parties: list[int]) -> dict:
    """Deep copies of the parties' stored states (whether stored at all) and data streams."""
    store = runner.trainer.store
    return {
        p: {
            "stored": p in store,
            "state": copy.deepcopy(store.get(p)) if p in store else {},
            "rng": runner.train_local[p].generator.get_state().clone(),
        }
        for p in parties
    }


def _put_back(runner: Any, held: dict) -> None:
    """The store and the data streams exactly as `_held` found them."""
    store = runner.trainer.store
    for party, saved in held.items():
        if saved["stored"]:
            store.put(party, copy.deepcopy(saved["state"]))
        else:
            store.drop(party)
        runner.train_local[party].generator.set_state(saved["rng"])


def _replay(runner: Any, traced: Traced) -> None:
    """Every round's parties trained again stacked from the inputs the sequential path had."""
    sequential = runner.train_many

    def train_many(tasks: list, r: int) -> list:
        parties = [p for p, _ in tasks]
        before = _held(runner, parties)
        done = sequential(tasks, r)
        if len(tasks) < 2:
            return done
        after = _held(runner, parties)
        _put_back(runner, before)
        runner.parallel = len(tasks)
        try:
            with counting_groups(traced.together):
                stacked = sequential(tasks, r)
            again = _held(runner, parties)
            for (p, _), one, other in zip(tasks, done, stacked, strict=True):
                where = f"round {r}, party {p}: "
                traced.replay += [
                    where + "upload " + d for d in _compare(one[1], other[1], FLOAT32_ONE_ROUND)
                ]
                state = _compare(after[p]["state"], again[p]["state"], FLOAT32_ONE_ROUND)
                traced.replay += [where + "kept state " + d for d in state]
        except Exception as err:  # the stacked path could not run what the sequential path ran
            traced.replay.append(stacked_failure(r, parties, err))
        finally:
            runner.parallel = 1
            _put_back(runner, after)
        return done

    runner.train_many = train_many


def _compare(one: Any, other: Any, atol: float) -> list[str]:
    return differences(snapshot(one), snapshot(other), atol=atol, names=STACKED)


def stacked_failure(r: int, parties: list[int], err: Exception) -> str:
    """Why parties trained together failed, with the usual cause named."""
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    hint = ""
    if "data-dependent control flow" in text or ".item()" in text or "vmap" in text:
        hint = (
            " -- the party side branches on a tensor's value (a Python `if`, `float()`, `.item()` on "
            "data), which parties trained together under torch.func.vmap cannot run; compute both "
            "branches and pick with torch.where"
        )
    return f"round {r}, parties {parties} trained together failed: {text}{hint}"


def traced_run(config: str | Path, overrides: list[str], folder: Path) -> Traced:
    """The reference run (module docstring), sequential, in `folder`."""
    traced = Traced(folder)
    with quiet_run(config, [*overrides, "train_args.parties_in_parallel=1"], folder) as run:
        _watch_payloads(run, traced)
        _replay(run.loop.runner, traced)
        traced.kept = watch(run)  # around the watched steps: fingerprints before and after each
        try:
            run.loop.run()
        except Exception as err:
            traced.error, traced.exception = f"{type(err).__name__}: {err}", err
        traced.snapshots[len(traced.snapshots)] = algorithm_objects(run)  # after the last round
    return traced


class _Stop(Exception):
    """Raised right after the checkpoint of the round a run is stopped at."""


def stopped_run(config: str | Path, overrides: list[str], folder: Path, after: int) -> str:
    """The run stopped right after the checkpoint of round `after` (as if killed there); "" or why
    it did not get there."""
    with quiet_run(config, [*overrides, "train_args.checkpoint_every=1"], folder) as run:
        loop = run.loop
        checkpoint = loop.checkpoint

        def stop_after(round_idx: int, cfg: dict) -> None:
            checkpoint(round_idx, cfg)
            if round_idx == after:
                raise _Stop

        loop.checkpoint = stop_after
        try:
            loop.run()
        except _Stop:
            return ""
        except Exception as err:
            return f"{type(err).__name__}: {err}"
    return f"the run ended before round {after}'s checkpoint"
