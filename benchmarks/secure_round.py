"""The cost of secure aggregation in a cross-silo round: one MOON round over the plugin's gRPC, on
loopback, without and with `privacy_args.secure_aggregation=true`.

Both runs are cross-silo MOON on the default job (config/fashion_mnist/moon.yaml: Fashion-MNIST from
Debian's package, Dir(0.5), simple CNN with its projection head) with 10 silos on 127.0.0.1 (the
plugin's gRPC, TLS off on loopback by default), each silo holding one party and all of them sampled
every round; 1 local epoch, 3 rounds, `data_args.max_train_samples=6000` (600 per silo),
`data_args.max_test_samples=1000`, `device_args.torch_threads=1` in every process, and
`validation_args.local_test=false` in both runs (secure aggregation refuses local test), so the two
runs differ only in secure aggregation: SecAgg (every other party a neighbour) by default, SecAgg+
with `--neighbours k`, and the extra message rounds of fedml_moon/distributed/server/secure.py.

From each run's metrics.jsonl the last round is taken (round 0 includes start-up); printed per run:
  - round_time_s: the round's wall clock on the server;
  - wire_sent / wire_received: the bytes the server sent and received on the wire in that round
    (difference of the cumulative `wire_bytes_sent` / `wire_bytes_received` to the previous round);
  - bytes_up: the uploads' payload bytes in that round (difference of the cumulative `bytes_up`).
Last line:  secure_vs_plain_time=<ratio> secure_vs_plain_bytes=<ratio> (bytes: sent + received on the
wire), followed by the targets (<= 1.3x the time, <= 1.5x the bytes); reported, not asserted.

Run: .venv/bin/python benchmarks/secure_round.py [--silos 10] [--rounds 3] [--samples 6000]
     [--neighbours k]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from fedml_moon import conformance

log = logging.getLogger("secure_round")
HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "config" / "fashion_mnist" / "moon.yaml"
TARGET_TIME, TARGET_BYTES = 1.3, 1.5
RUN_TIMEOUT_S = 420


def _overrides(args: argparse.Namespace, ipconfig: Path) -> list[str]:
    return [
        f"train_args.client_num_in_total={args.silos}",
        f"train_args.client_num_per_round={args.silos}",
        f"train_args.comm_round={args.rounds}",
        "train_args.epochs=1",
        f"data_args.max_train_samples={args.samples}",
        "data_args.max_test_samples=1000",
        "validation_args.local_test=false",
        "device_args.torch_threads=1",
        "tracking_args.enable_wandb=false",
        "common_args.training_type=cross_silo",
        "comm_args.backend=GRPC",
        f"comm_args.grpc_ipconfig_path={ipconfig}",
        "comm_args.timeout_s=300",
    ]


def _last_round(out: Path) -> dict:
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    prev, last = records[-2], records[-1]

    def delta(key: str) -> int:
        return last[key] - prev[key]

    return {
        "round": last["round"],
        "time_s": last["round_time_s"],
        "wire_sent": delta("wire_bytes_sent"),
        "wire_received": delta("wire_bytes_received"),
        "bytes_up": delta("bytes_up"),
    }


def run(name: str, args: argparse.Namespace, folder: Path, extra: list[str]) -> dict:
    """One cross-silo run (silos started before the server); the last round's figures."""
    folder = folder / name
    folder.mkdir(parents=True)
    ipconfig = conformance.write_ipconfig(folder / "ip.csv", args.silos + 1, conformance.free_port())
    out, env = folder / "out", conformance.process_env(folder)
    overrides = [*_overrides(args, ipconfig), *extra]
    ranks = [*range(1, args.silos + 1), 0]
    procs: list[subprocess.Popen] = []
    try:
        for rank in ranks:
            cmd = [*conformance.cli_command("run", CONFIG, overrides, out), "--rank", str(rank)]
            procs.append(conformance.spawn(cmd, folder / f"rank-{rank}.log", env, folder))
        log.info("%s: %d processes started, logs in %s", name, len(procs), folder)
        codes = conformance.wait_all(procs, RUN_TIMEOUT_S)
    finally:
        for proc in procs:
            conformance.stop(proc)
    if codes != [0] * len(procs):
        tails = "\n".join(
            f"--- rank {r} (rc {c})\n" + (folder / f"rank-{r}.log").read_text(errors="replace")[-1500:]
            for r, c in zip(ranks, codes, strict=True)
            if c != 0
        )
        raise RuntimeError(f"{name}: return codes {dict(zip(ranks, codes, strict=True))}\n{tails}")
    return _last_round(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=6000, help="data_args.max_train_samples")
    parser.add_argument("--neighbours", type=int, default=None, help="privacy_args.secagg_neighbours")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 0 includes start-up)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = Path(tempfile.mkdtemp(prefix="fedml-moon-secure-round-"))
    secure = ["privacy_args.secure_aggregation=true"]
    if args.neighbours is not None:
        secure.append(f"privacy_args.secagg_neighbours={args.neighbours}")
    results = {"plain": run("plain", args, folder, []), "secure": run("secure", args, folder, secure)}
    for name, r in results.items():
        sys.stdout.write(
            f"{name:<6} round {r['round']}: round_time_s={r['time_s']:.3f} wire_sent={r['wire_sent']} "
            f"wire_received={r['wire_received']} bytes_up={r['bytes_up']}\n"
        )
    plain, sec = results["plain"], results["secure"]
    ratio_t = sec["time_s"] / plain["time_s"]
    ratio_b = (sec["wire_sent"] + sec["wire_received"]) / (plain["wire_sent"] + plain["wire_received"])
    sys.stdout.write(
        f"secure_vs_plain_time={ratio_t:.3f} secure_vs_plain_bytes={ratio_b:.3f} "
        f"(targets: time <= {TARGET_TIME}x, bytes <= {TARGET_BYTES}x)\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
