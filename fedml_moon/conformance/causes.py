"""The usual causes of a failed check, found and named in words a contributor acts on: a party that
writes into what it received, random numbers drawn from the global state instead of the run's
generators, state kept where a resumed process cannot find it, float32 tensors in a float64 run."""

from __future__ import annotations

import contextlib
import itertools
import random
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedml_moon.conformance.kept import kept_cause
from fedml_moon.conformance.snapshot import differences, snapshot

INPLACE = (
    " -- the party side changed what it received in place; those tensors are every party's (one global "
    "model is sent to all): clone before changing (fedml_moon.core.aggregation.clone_state)"
)
SIDES = {
    "party": "the party side (context, loss, the step hooks or finish): draw from self.generator(r)",
    "server": "the server side (download, aggregate, aggregate_sums): draw from self.generator(round_idx)",
}


def received_changed(before: Any, download: Any, where: str) -> list[str]:
    """Where `download` (a snapshot of it taken before the party's round: `before`) changed."""
    found = differences(before, snapshot(download), "received", 0.0, ("as sent", "after its round"))
    return [f"{where}: {d}" for d in found[:2]]


@contextlib.contextmanager
def scrambled(run: Any, party_seed: int, server_seed: int) -> Iterator[None]:
    """Before every local round and every server step of `run`, torch's, numpy's and Python's global
    random state set from a stream of `party_seed` / `server_seed` (what an algorithm draws from
    them then depends on those, what it draws from the run's generators does not)."""
    runner, server = run.loop.runner, run.loop.server
    streams = {"party": itertools.count(party_seed * 1000), "server": itertools.count(server_seed * 1000)}

    def reseed(side: str) -> None:
        value = next(streams[side])
        torch.manual_seed(value), np.random.seed(value), random.seed(value)

    def wrapped(side: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            reseed(side)
            return fn(*args, **kwargs)

        return call

    runner.train_many = wrapped("party", runner.train_many)
    server.downloads = wrapped("server", server.downloads)
    server.aggregate = wrapped("server", server.aggregate)
    yield


def global_random_problems(
    config: str | Path, overrides: list[str], folder: Path, quiet_run: Callable[..., Any]
) -> list[str]:
    """The run three times in this process (`quiet_run`: `inprocess.quiet_run`), the global random
    state set differently before the party side's rounds or the server's steps: a side whose run then
    changes draws random numbers that the run's generators do not give."""

    def ends(name: str, party_seed: int, server_seed: int) -> Any:
        with quiet_run(config, overrides, folder / name) as run, scrambled(run, party_seed, server_seed):
            run.loop.run()
            return snapshot(run.loop.server.aggregator.global_state)

    reference = ends("reference", 1, 1)
    problems = []
    for side, seeds in (("party", (2, 1)), ("server", (1, 2))):
        found = differences(
            reference, ends(side, *seeds), "final model", 0.0, ("one", "another global state")
        )
        if found:
            problems.append(
                f"a random number not drawn from the run's generators, in {SIDES[side]} (never from "
                f"torch's, numpy's or Python's global random state): {found[0]}"
            )
    return problems


def resume_hint(problems: list[str], kept: Sequence[str] = ()) -> str:
    """What a resumed run that differs most likely lost: module state the run changed (`kept`) first,
    as what everything else follows from; then the party side: a party attribute that differs is what
    the server's differences follow from."""
    if problems and kept:
        return kept_cause(kept)
    if any(": party." in p and ": party.train_args." not in p for p in problems):  # not its config
        return (
            " -- party state kept on self, not in PartyRound.state: one object serves every party, and "
            "only r.state is stored per party and checkpointed"
        )
    if any(p.startswith("at the start") and ": server." in p for p in problems):
        return (
            " -- the server algorithm keeps this across rounds, but its state() / load_state() do not "
            "carry it: add it to both"
        )
    if problems:
        return (
            " -- neither algorithm object differs, nor a global or class attribute of the algorithm's "
            "modules, so the run kept something elsewhere that a resumed process starts without: a "
            "global of another module, or an object that module holds (keep a party's values in "
            "PartyRound.state, the server's in state() / load_state())"
        )
    return ""


def dtype_hint(err: BaseException) -> str:
    """For a float32 / float64 mismatch: that the algorithm's tensors must follow the model's dtype,
    and the line of the algorithm's code where it happened."""
    text = str(err)
    if not (("Double" in text and "Float" in text) or ("float" in text and "double" in text)):
        return ""
    where = plugin_line(err)
    return (
        " -- the algorithm made float32 tensors where the run is float64 (train_args.precision: fp64): "
        "create them in the model's dtype (torch.get_default_dtype(), or like a model tensor: "
        f"torch.zeros_like, t.new_zeros){f'; at {where}' if where else ''}"
    )


def plugin_line(err: BaseException) -> str:
    """The deepest frame of the error's traceback outside PyTorch and this package: `file:line (in f)`."""
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if "/torch/" not in f.filename and "/fedml_moon/" not in f.filename]
    if not own:
        return ""
    frame = own[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} (in {frame.name})"
