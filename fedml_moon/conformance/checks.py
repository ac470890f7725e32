"""The conformance suite any registered algorithm can be run through (`fedml-moon check ALGORITHM`).

On tiny data (`TINY`: 3 parties, 2 sampled per round, 3 rounds) it runs the algorithm the ways a
contributor cannot try by hand, and names what differs: payloads that no transport can carry; a
party that changes what it received; module globals and class attributes the run changes (named
as the cause of what the other checks then find); random numbers not drawn from the run's
generators; a run that does not repeat itself; stacked and sequential parties that compute
something else (one local round from identical inputs in float32, every round in float64); a run
stopped and resumed that does not go on as the uninterrupted one (server state, party states,
final model); a secure sum that loses part of an upload; and every deployment mode against the
standalone run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from fedml_moon.conformance.buffered import BUFFERED, buffered_vs_sync
from fedml_moon.conformance.causes import INPLACE, global_random_problems, resume_hint
from fedml_moon.conformance.inprocess import (
    FLOAT32_ONE_ROUND,
    FLOAT64_ROUNDS,
    Traced,
    quiet_run,
    stopped_run,
    traced_run,
)
from fedml_moon.conformance.kept import KEPT, KEPT_HINT, blamed, kept_cause, not_judged
from fedml_moon.conformance.network import network_checks
from fedml_moon.conformance.paths import Outcome, float64_rounds, secure_vs_plain
from fedml_moon.conformance.processes import (
    MODES,
    TINY,
    RunResult,
    metric_differences,
    process_env,
    run_mode,
    services,
    spawn,
    wait_all,
)
from fedml_moon.conformance.snapshot import differences, snapshot
from fedml_moon.run_folder import PARTY_FILE, PARTY_STATE, RunFolder

STOP_AFTER = 1  # the round after whose checkpoint the resume check stops its run
RESUMED = ("uninterrupted", "resumed")
ONE_ROUND = f"stacked parties: one local round from identical inputs equals sequential (float32, {FLOAT32_ONE_ROUND:g})"  # noqa: E501


def party_states(run_dir: Path) -> dict[str, dict]:
    """Every party's stored state (state_store: disk) under a run folder, wherever its worker kept it."""
    import torch

    found = sorted(run_dir.rglob(f"{PARTY_STATE}/{PARTY_FILE.format('*')}"))
    return {p.name: torch.load(p, weights_only=True) for p in found}


def payload_problems(config: str | Path, overrides: list[str], folder: Path) -> list[str]:
    """Run the config in this process and check that every payload, report and party state holds only
    tensors, dicts, lists and JSON values (what the transports can carry, decoded without pickle)."""
    from fedml_moon.core.validate import BadUpload

    traced = traced_run(config, overrides, folder / "payloads")
    if traced.exception is not None and not isinstance(traced.exception, BadUpload):
        raise traced.exception
    stopped = [f"the server refused the uploads: {traced.exception}"] if traced.exception else []
    return traced.problems + stopped  # what was found before a refusal still counts, and comes first


def run_differences(a: RunResult, b: RunResult, atol: float, names: tuple[str, str]) -> list[str]:
    """Where two runs' final models differ beyond `atol` (by tensor and entry, with both values),
    then the metrics that differ beyond 1e-4 (`processes.metric_differences`)."""
    import torch

    paths = [RunFolder(r.out_dir).final_model for r in (a, b)]
    models = [torch.load(path, map_location="cpu", weights_only=True) for path in paths]
    found = differences(snapshot(models[0]), snapshot(models[1]), "final model", atol, names)
    return found[:3] + metric_differences(a, b)[:3]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""  # why it failed
    note: str = ""  # said whatever the outcome


def _from(name: str, outcome: Outcome) -> Check:
    if outcome.skipped:
        return Check(name, True, note=f"not applicable: {outcome.skipped}")
    if outcome.error:
        return Check(name, False, outcome.error, outcome.note)
    return Check(name, not outcome.problems, "; ".join(outcome.problems[:4]), outcome.note)


def _one_round_check(traced: Traced, float64: Outcome) -> Check:
    """Stacked against sequential, one local round from identical inputs, in float32. A gap beyond
    FLOAT32_ONE_ROUND where the float64 run agrees all along is float32 rounding (a kink of a ReLU
    or hinge crossed one way in one path and the other way in the other), said in the note."""
    name = ONE_ROUND
    if not traced.together:
        why = f": {traced.replay[0]}" if traced.replay else ""
        return Check(name, False, "no round trained parties together" + why)
    note = f"groups of {sorted(set(traced.together))} parties trained together"
    failed = "; ".join(traced.replay[:4])
    rounding = float64.ok and all("differ by" in r for r in traced.replay)
    if traced.replay and rounding:
        gaps = [float(m) for m in re.findall(r"differ by ([0-9.e+-]+)", " ".join(traced.replay))]
        note += (
            f"; float32 differs by up to {max(gaps):.3g} in {len(traced.replay)} entries, and float64 "
            "agrees: rounding, not a difference of the two paths"
        )
    return Check(name, not traced.replay or rounding, failed, note)


def resume_check(config: Path, overrides: list[str], folder: Path, traced: Traced) -> Check:
    """The run stopped after round STOP_AFTER's checkpoint and resumed in a fresh process (the probe)
    holds at every round's start what the uninterrupted `traced` run held, and ends the same."""
    import torch

    name = (
        f"stopped after round {STOP_AFTER} and resumed: the same server state, party states and final model"
    )
    out, saved = folder / "resumed", folder / "resumed-snapshots.pt"
    sets = [*overrides, "train_args.parties_in_parallel=1", "train_args.checkpoint_every=1"]
    why = stopped_run(config, sets, out, STOP_AFTER)
    if why:
        return Check(name, False, f"the run to stop: {why}")
    cmd = [sys.executable, "-m", "fedml_moon.conformance.probe", "--cf", str(config)]
    for item in sets:
        cmd += ["--set", item]
    cmd += ["--resume", str(out), "--snapshots", str(saved)]
    log = folder / "resumed.log"
    codes = wait_all([spawn(cmd, log, process_env(folder / "home"), Path.cwd())], 300)
    if codes != [0] or not saved.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        return Check(name, False, f"the resumed run failed (exit {codes[0]}):\n{tail}")
    seen = torch.load(saved, weights_only=True)
    problems = []
    for r in sorted(seen):
        found = differences(traced.snapshots.get(r), seen[r], names=RESUMED)
        if found:
            problems += [f"at the start of round {r}: {d}" for d in found[:4]]
            break
    kept = [{k: v for k, v in party_states(d).items() if v} for d in (traced.folder, out)]  # {}: none
    problems += differences(*kept, "party states", names=RESUMED)[:4]
    problems += run_differences(
        RunResult("traced", traced.folder, [0], []), RunResult("resumed", out, [0], []), 0.0, RESUMED
    )
    return Check(name, not problems, "; ".join(problems[:6]) + resume_hint(problems, traced.kept))


def _modes(
    config: Path, overrides: list[str], folder: Path, ref: RunResult, modes: tuple[str, ...]
) -> list[Check]:
    checks, ref_states = [], party_states(ref.out_dir)
    with contextlib.ExitStack() as stack:
        svc = stack.enter_context(services(folder / "services")) if "mqtt-s3" in modes else None
        for mode in (m for m in modes if m != "standalone"):
            run = run_mode(mode, config, overrides, folder, svc)
            if not run.ok:
                checks.append(
                    Check(f"{mode}: runs", False, f"return codes {run.returncodes}\n{run.tail(15)}")
                )
                continue
            found = run_differences(ref, run, 1e-5, ("standalone", mode))
            checks.append(
                Check(f"{mode}: same final model (<= 1e-5) and metrics", not found, "; ".join(found))
            )
            states = party_states(run.out_dir)
            found = differences(ref_states, states, "party states", 1e-5, ("standalone", mode))
            checks.append(
                Check(f"{mode}: every party's state follows the party", not found, "; ".join(found[:3]))
            )
    return checks


def tiny(config: Path, overrides: list[str]) -> list[str]:
    """TINY, less the sample caps where the config's partition is natural (a site's own parties,
    whose samples it keeps whole: small folders make a tiny run)."""
    from fedml_moon.config.load import load_config

    if load_config(config, overrides).data_args.partition_method != "natural":
        return list(TINY)
    return [
        t for t in TINY if not t.startswith(("data_args.max_train_samples", "data_args.max_test_samples"))
    ]


def check_algorithm(
    config: str | Path, overrides: list[str], folder: Path, modes: tuple[str, ...] = MODES
) -> list[Check]:
    """The conformance suite (module docstring); each check says what it compared and, failing, where
    the two sides differ."""
    from fedml_moon.config.load import load_config

    folder, config = Path(folder).resolve(), Path(config).resolve()
    overrides = [
        *tiny(config, overrides),
        "train_args.checkpoint_every=1",
        *overrides,
    ]  # as the resume check's
    train = load_config(config, overrides).train_args
    found, unstackable = network_checks(config, overrides)
    checks = [Check(*c) for c in found]
    if not all(c.ok for c in checks):
        return checks
    traced = traced_run(config, overrides, folder / "traced")
    checks += [
        Check(
            "payloads, reports and party states are tensors and JSON values",
            not traced.problems,
            "; ".join(traced.problems[:3]),
        )
    ]
    if traced.error:
        return [*checks, Check("the standalone run (in this process)", False, traced.error)]
    changed = "; ".join(traced.changed[:3]) + (INPLACE if traced.changed else "")
    checks.append(Check("what a party received is as it was sent after its round", not changed, changed))
    checks += _kept_and_random(config, overrides, folder, traced)
    if unstackable:  # the network trains one party at a time: nothing to compare
        float64 = Outcome(skipped=f"the network cannot be stacked ({unstackable})")
        checks.append(_from(ONE_ROUND, float64))
    else:
        float64 = float64_rounds(config, overrides, folder / "float64", train.client_num_per_round)
        checks.append(_one_round_check(traced, float64))
    ref = run_mode("standalone", config, overrides, folder)
    if not ref.ok:
        return [*checks, Check("standalone run", False, ref.tail())]
    found = run_differences(
        ref, RunResult("traced", traced.folder, [0], []), 0.0, ("command line", "this process")
    )
    name = "the same run twice (the command line and this process): same final model and metrics"
    checks.append(Check(name, not found, "; ".join(found)))
    checks.append(
        _from(f"stacked parties equal sequential over every round in float64 ({FLOAT64_ROUNDS:g})", float64)
    )
    checks.append(resume_check(config, overrides, folder, traced))
    outcome = secure_vs_plain(config, overrides, folder / "secure", train.client_num_in_total)
    checks.append(_from("secure aggregation: the aggregate equals the plain one", outcome))
    outcome = buffered_vs_sync(config, overrides, folder / "buffered", train.client_num_in_total)
    checks.append(_from(BUFFERED, outcome))
    return _kept_first(_no_excuse(checks + _modes(config, overrides, folder, ref, modes), traced), traced)


def _kept_and_random(config: Path, overrides: list[str], folder: Path, traced: Traced) -> list[Check]:
    """Module state the traced run changed (`kept.watch`), then random numbers drawn from the global
    state: not judged when there is module state, since each run compared would start from another
    value of it."""
    kept = "; ".join(traced.kept[:3]) + (KEPT_HINT if traced.kept else "")
    if traced.kept:
        found = [not_judged(traced.kept)]
    else:
        found = global_random_problems(config, overrides, folder / "random", quiet_run)
    name = "random numbers come from the run's generators (the global random state set otherwise)"
    return [Check(KEPT, not kept, kept), Check(name, not found, "; ".join(found))]


def _no_excuse(checks: list[Check], traced: Traced) -> list[Check]:
    """float32's rounding excuses the one-round gap only when every other check passes: a plugin that
    fails elsewhere may owe the gap to the same defect."""
    excused = next((c for c in checks if c.ok and "rounding, not a difference" in c.note), None)
    if excused is None or all(c.ok for c in checks):
        return checks
    detail = "; ".join(traced.replay[:4]) + " -- another check fails: float32 rounding does not explain it"
    failed = Check(excused.name, False, detail, excused.note.split("; float32 differs")[0])
    return [failed if c is excused else c for c in checks]


def _kept_first(checks: list[Check], traced: Traced) -> list[Check]:
    """Module state the run changed (`kept.watch`) makes every later run-against-run check fail: each
    failing one after it is said to possibly follow from it, where it does not say so already."""
    cause = kept_cause(traced.kept)
    at = next((i for i, c in enumerate(checks) if c.name == KEPT), None)
    if not cause or at is None:
        return checks
    later = checks[at + 1 :]
    said = [c if c.ok or blamed(c.detail) else dataclasses.replace(c, detail=c.detail + cause) for c in later]
    return checks[: at + 1] + said
