"""The conformance suite any registered algorithm can be run through (`fedml-moon check ALGORITHM`)."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from fedml_moon.conformance.processes import MODES, TINY, RunResult, compare, run_mode, services


def party_states(run_dir: Path) -> dict[str, dict]:
    """Every party's stored state (state_store: disk) under a run folder, wherever its worker kept it."""
    import torch

    return {p.name: torch.load(p, weights_only=True) for p in sorted(run_dir.rglob("party_state/party_*.pt"))}


def same_tree(a: object, b: object, atol: float = 1e-5) -> bool:
    """Nested dicts / lists of tensors and JSON values equal (tensors to `atol`)."""
    import torch

    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and torch.allclose(a.double(), b.double(), atol=atol, rtol=0)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tree(a[k], b[k], atol) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same_tree(x, y, atol) for x, y in zip(a, b, strict=True))
        )
    return a == b


def payload_problems(config: str | Path, overrides: list[str], folder: Path) -> list[str]:
    """Run the config in this process and check that every payload, report and party state holds only
    tensors, dicts, lists and JSON values (what the transports can carry, decoded without pickle)."""
    from fedml_moon.adapters.run import assemble
    from fedml_moon.config import load_config
    from fedml_moon.core.codec import decode, encode
    from fedml_moon.core.validate import BadUpload

    problems: list[str] = []

    def check(obj: object, where: str) -> None:
        try:
            if not same_tree(obj, decode(encode(obj)), atol=0.0):
                problems.append(f"{where}: changes when encoded and decoded")
        except (TypeError, ValueError) as err:
            problems.append(f"{where}: {err}")

    run = assemble(load_config(config, overrides), folder / "payloads")
    server, runner = run.loop.server, run.loop.runner
    downloads, train, evaluate = server.downloads, runner.train, runner.evaluate

    def checked_downloads(r: int) -> dict:
        out = downloads(r)
        for party, payload in out.items():
            check(payload, f"round {r}: the server's payload for party {party}")
        return out

    def checked_train(party: int, download: dict, r: int) -> tuple:
        n, upload = train(party, download, r)
        check(upload, f"round {r}: party {party}'s upload")
        check(runner.trainer.store.get(party), f"round {r}: party {party}'s state")
        return n, upload

    def checked_evaluate(party: int, download: dict) -> dict:
        report = evaluate(party, download)
        check(report, f"party {party}'s evaluation report")
        return report

    server.downloads, runner.train, runner.evaluate = checked_downloads, checked_train, checked_evaluate
    try:
        run.loop.run()
    except BadUpload as err:  # what was found before it still counts, and comes first
        problems.append(f"the server refused the uploads: {err}")
    return problems


def batched_check(config: str | Path, overrides: list[str], folder: Path, ref: RunResult) -> Check:
    """The sampled parties trained together (`parties_in_parallel`) end within 1e-4 of the sequential
    run `ref`; the note says how many trained together (the log's first batched round)."""
    run = run_mode("standalone", config, [*overrides, "train_args.parties_in_parallel=3"], folder / "batched")
    name = "batched (parties_in_parallel: 3): final model within 1e-4 of sequential"
    if not run.ok:
        return Check(name, False, run.tail(15))
    diff, problems = compare(ref, run)  # metrics within 1e-4
    logs = "".join(p.read_text(errors="replace") for p in run.logs)
    together = re.search(r"round \d+: (\d+) parties trained together \(batched\)", logs)
    if together is None:
        return Check(name, False, "no parties trained together: the log has no batched round")
    note = f"{together.group(1)} parties trained together"
    return Check(name, diff <= 1e-4 and not problems, f"{diff:g} {problems[:3]}", note)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""  # why it failed
    note: str = ""  # said whatever the outcome


def check_algorithm(
    config: str | Path, overrides: list[str], folder: Path, modes: tuple[str, ...] = MODES
) -> list[Check]:
    """The conformance suite: payloads carry only tensors and JSON values, a seed gives the same run
    twice, and every mode gives the standalone loop's final model, metrics and per-party states."""
    overrides, folder = [*TINY, *overrides], Path(folder).resolve()
    checks = []
    problems = payload_problems(config, overrides, folder)
    checks.append(
        Check(
            "payloads, reports and party states are tensors and JSON values",
            not problems,
            "; ".join(problems[:3]),
        )
    )
    ref = run_mode("standalone", config, overrides, folder)
    if not ref.ok:
        return [*checks, Check("standalone run", False, ref.tail())]
    again = run_mode("standalone", config, overrides, folder / "again")
    diff, diffs = compare(ref, again) if again.ok else (float("inf"), ["the second run failed"])
    checks.append(
        Check(
            "deterministic for a seed (standalone twice)", diff == 0.0 and not diffs, f"{diff:g} {diffs[:3]}"
        )
    )
    checks.append(batched_check(config, overrides, folder, ref))
    ref_states = party_states(ref.out_dir)
    with contextlib.ExitStack() as stack:
        svc = stack.enter_context(services(folder / "services")) if "mqtt-s3" in modes else None
        for mode in (m for m in modes if m != "standalone"):
            run = run_mode(mode, config, overrides, folder, svc)
            if not run.ok:
                checks.append(
                    Check(f"{mode}: runs", False, f"return codes {run.returncodes}\n{run.tail(15)}")
                )
                continue
            diff, diffs = compare(ref, run)
            checks.append(
                Check(
                    f"{mode}: same final model (<= 1e-5) and metrics",
                    diff <= 1e-5 and not diffs,
                    f"{diff:g} {diffs[:3]}",
                )
            )
            states = party_states(run.out_dir)
            same = states.keys() == ref_states.keys() and all(
                same_tree(ref_states[k], states[k]) for k in states
            )
            checks.append(
                Check(
                    f"{mode}: every party's state follows the party",
                    same,
                    f"{sorted(states)} vs {sorted(ref_states)}",
                )
            )
    return checks
