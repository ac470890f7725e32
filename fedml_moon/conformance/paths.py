"""Two ways to compute one thing, compared inside this process: the server's aggregate from plain
uploads and from their secure sum (`privacy_args.secure_aggregation`), and stacked against
sequential parties over every round of a run in float64 (`train_args.precision: fp64`), where
float32's rounding cannot hide a real difference or pass for one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedml_moon.conformance.causes import dtype_hint
from fedml_moon.conformance.inprocess import FLOAT64_ROUNDS, STACKED, counting_groups, quiet_run
from fedml_moon.conformance.snapshot import differences, snapshot
from fedml_moon.errors import ConfigError


@dataclass
class Outcome:
    """What a comparison found: its differences (empty: the two agree), or why it could not run
    (`error`), or why it does not apply (`skipped`); `note` is said either way."""

    problems: list[str] = field(default_factory=list)
    error: str = ""
    skipped: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and not self.error


def _one_round(config: str | Path, overrides: list[str], folder: Path) -> tuple[Any, dict]:
    """Round 0 of the run, in this process: (the run, the uploads the server aggregated)."""
    with quiet_run(config, overrides, folder) as run:
        server, seen = run.loop.server, {}
        aggregate = server.aggregate

        def kept(round_idx: int, results: dict) -> list:
            seen.update(results)
            return aggregate(round_idx, results)

        server.aggregate = kept
        run.loop.one_round(0)
    return run, seen


def secure_vs_plain(config: str | Path, overrides: list[str], folder: Path, parties: int) -> Outcome:
    """One round from identical inputs, aggregated plainly and under secure aggregation (every party
    of the run sampled, `parties`): the new global model, the server algorithm's state and each
    party's next download agree within the fixed point's rounding."""
    from fedml_moon.config.load import load_config
    from fedml_moon.registry import get_algorithm

    common = [*overrides, f"train_args.client_num_per_round={parties}", "validation_args.local_test=false"]
    spec = get_algorithm(load_config(config, common).train_args.algorithm)
    if not spec.server.summed or not spec.server.averages:
        return Outcome(skipped=f"{spec.name} sums nothing (each party keeps its own model)")
    plain, plain_uploads = _one_round(config, common, folder / "plain")
    try:
        secure, secure_uploads = _one_round(
            config, [*common, "privacy_args.secure_aggregation=true"], folder / "secure"
        )
    except ConfigError as err:
        return Outcome(error=f"secure aggregation refuses this algorithm or config: {err}")
    names = ("plain", "secure")
    inputs = differences(snapshot(plain_uploads), snapshot(secure_uploads), "uploads", 0.0, names)
    if inputs:
        return Outcome(error=f"the two runs' uploads differ before aggregation: {inputs[:3]}")
    atol = 2 * secure.loop.server.privacy.encoding.error_bound(parties)
    a, b = plain.loop.server.aggregator, secure.loop.server.aggregator
    counters = [k for k, v in a.global_state.items() if not v.is_floating_point()]

    def summed(state: Any) -> Any:  # integer counters: no private sum carries them (the server's stay)
        def drop(tree: Any) -> dict:
            return {k: v for k, v in tree.items() if k not in counters}

        if isinstance(state.get("model"), dict):  # a download: the model beside the algorithm's own
            return snapshot({**state, "model": drop(state["model"])})
        return snapshot(drop(state))

    found = differences(summed(a.global_state), summed(b.global_state), "global model", atol, names)
    found += differences(snapshot(a.algorithm), snapshot(b.algorithm), "server algorithm", atol, names)
    for party in range(parties):
        down = summed(a.get_model_params_for(party)), summed(b.get_model_params_for(party))
        found += differences(*down, f"round 1 download to party {party}", atol, names)
    note = f"within the fixed point's rounding, {atol:.2g}"
    if counters:
        note += f"; {len(counters)} integer counters ({counters[0]}, ...) stay the server's, as documented"
    return Outcome(found, note=note)


def _uploads_by_round(config: str | Path, overrides: list[str], folder: Path, sizes: list[int]) -> tuple:
    """Every round's uploads {round: {party: upload}} and the final model of a whole run."""
    with quiet_run(config, overrides, folder) as run:
        runner, seen = run.loop.runner, {}
        train_many = runner.train_many

        def kept(tasks: list, round_idx: int) -> list:
            done = train_many(tasks, round_idx)
            seen[round_idx] = {p: snapshot(u) for (p, _), (_, u) in zip(tasks, done, strict=True)}
            return done

        runner.train_many = kept
        with counting_groups(sizes):
            run.loop.run()
        return seen, snapshot(run.loop.server.aggregator.global_state)


def float64_rounds(config: str | Path, overrides: list[str], folder: Path, stacked: int) -> Outcome:
    """The whole run in float64 twice, parties one after another and `stacked` at a time: every
    round's upload of every party and the final model agree within FLOAT64_ROUNDS; the first round
    where they do not is named with its party and tensor."""
    f64 = [*overrides, "train_args.precision=fp64"]
    sizes: list[int] = []
    try:
        one, final_one = _uploads_by_round(
            config, [*f64, "train_args.parties_in_parallel=1"], folder / "seq", []
        )
        other, final_other = _uploads_by_round(
            config, [*f64, f"train_args.parties_in_parallel={stacked}"], folder / "stacked", sizes
        )
    except Exception as err:
        return Outcome(error=f"{type(err).__name__}: {err}{dtype_hint(err)}")
    note = (
        f"groups of {sorted(set(sizes))} parties trained together" if sizes else "no parties trained together"
    )
    for r in sorted(one):
        for party in sorted(one[r]):
            found = differences(one[r][party], other[r].get(party), "upload", FLOAT64_ROUNDS, STACKED)
            if found:
                return Outcome([f"round {r}, party {party}: {d}" for d in found], note=note)
    found = differences(final_one, final_other, "final model", FLOAT64_ROUNDS, STACKED)
    return Outcome(found, note=note)
