"""One MOON round in every mode, as a ratio to the standalone round measured in the same run.

Setting: the default job (Fashion-MNIST, 10 parties, Dir(0.5), simple CNN, batch 64), 1 local epoch,
2 rounds; round 1 is compared (`round_time_s` of metrics.jsonl: from the server's first download to
the round's record, evaluation included; process start-up is not part of it). Every mode runs on this
machine on 127.0.0.1: the MPI simulation with 2 workers, cross-silo over MPI and over gRPC with 10
silos, MQTT + S3 with 10 devices (mosquitto and moto started here). Every process uses
`torch_threads: auto` (1 thread on 2 cores), so the standalone round uses one core where the
distributed modes use all of them; the standalone round with every core in its thread team is
measured too. Also printed: the payload bytes of the round (the same in every mode) and the encoded
bytes the server sent and received for it.
Last line:  mpi_simulation_vs_standalone=<ratio> ... grpc_vs_standalone_all_cores=<ratio> ...

Run: .venv/bin/python benchmarks/modes.py [--modes standalone,mpi-simulation,...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from fedml_moon import conformance

log = logging.getLogger("modes")
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
OVERRIDES = ["train_args.comm_round=2", "train_args.epochs=1", "tracking_args.enable_wandb=false"]
SHORT = {
    "mpi-simulation": "mpi_simulation",
    "cross-silo-mpi": "cross_silo_mpi",
    "cross-silo-grpc": "grpc",
    "mqtt-s3": "mqtt_s3",
}


def round_one(run: conformance.RunResult) -> dict:
    """Round 1's time and bytes: payload bytes (both ways) and the server's wire bytes."""
    records = [json.loads(x) for x in (run.out_dir / "metrics.jsonl").read_text().splitlines()]
    r0, r1 = records[0], records[1]
    out = {
        "time_s": r1["round_time_s"],
        "payload_bytes": (r1["bytes_up"] + r1["bytes_down"]) - (r0["bytes_up"] + r0["bytes_down"]),
    }
    if "wire_bytes_sent" in r1:
        out["wire_bytes"] = (r1["wire_bytes_sent"] + r1["wire_bytes_received"]) - (
            r0["wire_bytes_sent"] + r0["wire_bytes_received"]
        )
    return out


def measure(modes: list[str], folder: Path) -> dict[str, dict]:
    """Round 1 of every run: the standalone loop (auto threads, then every core) and each mode."""
    cores = len(os.sched_getaffinity(0))
    runs = [("standalone", "standalone", OVERRIDES)]
    runs.append(("standalone, every core", "standalone", [*OVERRIDES, f"device_args.torch_threads={cores}"]))
    runs += [(m, m, OVERRIDES) for m in modes if m != "standalone"]
    results = {}
    with conformance.services(folder / "services") as svc:
        for label, mode, overrides in runs:
            where = folder / label.replace(", ", "-").replace(" ", "-")
            run = conformance.run_mode(mode, CONFIG, overrides, where, svc, timeout_s=900)
            if not run.ok:
                raise RuntimeError(f"{label} failed (return codes {run.returncodes}):\n{run.tail()}")
            results[label] = round_one(run)
            log.info("%s: %s", label, results[label])
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(conformance.MODES))
    modes = parser.parse_args().modes.split(",")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    results = measure(modes, Path(tempfile.mkdtemp(prefix="fedml-moon-modes-")))
    base, all_cores = results["standalone"]["time_s"], results["standalone, every core"]["time_s"]
    for label, r in results.items():
        wire = f", server wire bytes {r['wire_bytes'] / 1e6:.2f} MB" if "wire_bytes" in r else ""
        log.info(
            "%-22s round %.2f s (%.3fx standalone, %.3fx standalone on every core), payload %.2f MB%s",
            label,
            r["time_s"],
            r["time_s"] / base,
            r["time_s"] / all_cores,
            r["payload_bytes"] / 1e6,
            wire,
        )
    mine = [(SHORT[m], r["time_s"]) for m, r in results.items() if m in SHORT]
    line = " ".join(f"{name}_vs_standalone={t / base:.3f}" for name, t in mine)
    line += " " + " ".join(f"{name}_vs_standalone_all_cores={t / all_cores:.3f}" for name, t in mine)
    sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
