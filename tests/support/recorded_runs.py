"""A fixed set of seeded short runs, recorded: every algorithm sequential and batched, one MPI
simulation, one cross-silo gRPC run and one run killed and resumed. Each run's final-model digest and
metrics (timings and wire bytes aside) go to a JSON file; checking re-runs the set and compares, so a
change that must not change results (a refactoring) can show that it did not.

    .venv/bin/python tests/support/recorded_runs.py --record tests/support/recorded_runs.json
    .venv/bin/python tests/support/recorded_runs.py --check tests/support/recorded_runs.json
    .venv/bin/python tests/support/recorded_runs.py --check FILE --only moon-batched ...

Digests are bitwise: record and check on the same machine, PyTorch build and thread count.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedml_moon import conformance  # noqa: E402

log = logging.getLogger("recorded_runs")
CONFIGS = ROOT / "config" / "fashion_mnist"
SETTINGS = [
    *conformance.TINY,
    "data_args.max_train_samples=800",  # the samples of the recorded file
    "data_args.max_test_samples=300",
    "train_args.client_num_in_total=5",
    "train_args.client_num_per_round=4",  # MOON's pools grow at different paces
    "train_args.comm_round=4",
    "train_args.checkpoint_every=1",
    "validation_args.frequency_of_the_test=2",
    "device_args.torch_threads=1",
]
ALGORITHMS = {
    "fedavg": ("fedavg.yaml", []),
    "fedprox": ("fedprox.yaml", []),
    "moon": ("moon.yaml", []),
    "moon-l2": ("moon.yaml", ["algorithm_args.representation_loss=l2"]),
    "fedssc": ("fedssc.yaml", []),
    "lg": ("lg.yaml", ["algorithm_args.warmup_rounds=2"]),
    "scaffold": ("scaffold.yaml", []),
    "solo": ("solo.yaml", []),
    "fedavgm": ("fedavg.yaml", ["server_args.server_momentum=0.9"]),
}


def runs() -> dict[str, tuple[str, Path, list[str]]]:
    """name -> (mode, config, overrides)."""
    out: dict[str, tuple[str, Path, list[str]]] = {}
    for name, (config, extra) in ALGORITHMS.items():
        for path, parallel in (("sequential", 1), ("batched", 3)):
            sets = [*SETTINGS, *extra, f"train_args.parties_in_parallel={parallel}"]
            out[f"{name}-{path}"] = ("standalone", CONFIGS / config, sets)
    out["moon-mpi-simulation"] = ("mpi-simulation", CONFIGS / "moon.yaml", list(SETTINGS))
    out["scaffold-cross-silo-grpc"] = ("cross-silo-grpc", CONFIGS / "scaffold.yaml", list(SETTINGS))
    out["moon-resumed"] = ("resumed", CONFIGS / "moon.yaml", list(SETTINGS))
    return out


def outcome(run_dir: Path) -> dict:
    """The run's final-model digest and its records without timings and wire bytes."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keep = [
        {k: v for k, v in r.items() if not k.endswith("_time_s") and not k.startswith("wire_")}
        for r in records
    ]
    return {"status": summary["status"], "final_model_sha256": summary["final_model_sha256"], "records": keep}


def resumed(config: Path, overrides: list[str], folder: Path) -> Path:
    """Standalone, SIGKILLed after round 1 is recorded, then resumed with --resume."""
    folder.mkdir(parents=True, exist_ok=True)
    out, env = folder / "run", conformance.process_env(folder)
    cmd = conformance.cli_command("simulate", config, overrides, out)
    proc = conformance.spawn(cmd, folder / "first.log", env, folder)
    deadline, metrics = time.monotonic() + 300, out / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"the run ended before it could be killed: {(folder / 'first.log').read_text()[-2000:]}"
            )
        time.sleep(0.05)
    conformance.stop(proc, first=signal.SIGKILL)
    again = conformance.spawn([*cmd, "--resume", str(out)], folder / "resume.log", env, folder)
    if conformance.wait_all([again], 300) != [0]:
        raise RuntimeError((folder / "resume.log").read_text()[-2000:])
    return out


def run_one(mode: str, config: Path, overrides: list[str], folder: Path) -> dict:
    if mode == "resumed":
        return outcome(resumed(config, overrides, folder))
    svc = None
    result = conformance.run_mode(mode, config, overrides, folder, svc)
    if not result.ok:
        raise RuntimeError(result.tail())
    return outcome(result.out_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", type=Path, help="run the set and write the outcomes here")
    group.add_argument("--check", type=Path, help="run the set and compare with the outcomes here")
    ap.add_argument("--only", nargs="*", help="these runs only")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    chosen = {k: v for k, v in runs().items() if not args.only or k in args.only}
    recorded = json.loads(args.check.read_text()) if args.check else {}
    got, differ = {}, []
    with tempfile.TemporaryDirectory(prefix="recorded-runs-") as tmp:
        for name, (mode, config, overrides) in chosen.items():
            started = time.monotonic()
            got[name] = run_one(mode, config, overrides, Path(tmp) / name)
            same = args.check is None or recorded.get(name) == got[name]
            if not same:
                differ.append(name)
            log.info(
                "%-28s %s %s (%.0f s)",
                name,
                got[name]["final_model_sha256"][:16],
                "recorded" if args.record else "same" if same else "DIFFERS",
                time.monotonic() - started,
            )
            if args.record:  # as each run ends: a later failure keeps the earlier ones
                previous = json.loads(args.record.read_text()) if args.record.exists() else {}
                previous[name] = got[name]
                args.record.write_text(json.dumps(previous, indent=1, sort_keys=True) + "\n")
    if args.record:
        return 0
    log.info(
        "%d of %d runs as recorded%s",
        len(got) - len(differ),
        len(got),
        f"; differ: {differ}" if differ else "",
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
