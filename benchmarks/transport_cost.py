"""The cost of the hardened gRPC transport against FedML's own plain gRPC, on loopback: one MOON round.

Both runs are cross-silo MOON on the default job (Fashion-MNIST, 10 silos, Dir(0.5), 1 local epoch,
2 rounds; round 1 compared: `round_time_s` and the bytes the server sent and received in it) with
the same managers and algorithm code; only the transport differs:
  - hardened: the plugin's gRPC, TLS with mutual authentication (certificates from `fedml-moon certs`),
    safetensors + JSON frames, heartbeats;
  - FedML: FedML 0.9.6's GRPCCommManager (plain, pickled frames, every node listening, a receive loop
    that polls; benchmarks/fedml_grpc_process.py plugs it in).
Last line:  hardened_vs_fedml_time=<ratio> hardened_vs_fedml_bytes=<ratio>

Run: .venv/bin/python benchmarks/transport_cost.py
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import tempfile
import time
from pathlib import Path

from fedml_moon import conformance
from fedml_moon.security import make_certs

log = logging.getLogger("transport_cost")
HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "config" / "fashion_mnist" / "moon.yaml"
SILOS = 10


def _overrides(ipconfig: Path) -> list[str]:
    return [
        "train_args.comm_round=2",
        "train_args.epochs=1",
        "tracking_args.enable_wandb=false",
        "common_args.training_type=cross_silo",
        "comm_args.backend=GRPC",
        f"comm_args.grpc_ipconfig_path={ipconfig}",
        "comm_args.timeout_s=600",
    ]


def _round_one(out: Path) -> dict:
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    r0, r1 = records
    wire = (r1["wire_bytes_sent"] + r1["wire_bytes_received"]) - (
        r0["wire_bytes_sent"] + r0["wire_bytes_received"]
    )
    return {"time_s": r1["round_time_s"], "wire_bytes": wire}


def _wait_for_port(port: int, proc, limit_s: float = 120) -> None:
    """Until something accepts connections on 127.0.0.1:port (FedML's server is up)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"FedML's gRPC server did not listen on port {port}")


def _run(commands: list[list[str]], folder: Path, server_port: int | None = None) -> None:
    env = conformance.process_env(folder)
    order = list(range(len(commands)))  # index 0 is the server
    order = order if server_port else [*order[1:], 0]  # FedML's needs its server up first
    procs = {}
    for i in order:
        procs[i] = conformance.spawn(commands[i], folder / f"rank-{i}.log", env, folder)
        if server_port and i == 0:
            _wait_for_port(server_port, procs[0])
    codes = conformance.wait_all([procs[i] for i in sorted(procs)], 900)
    if codes != [0] * len(commands):
        tails = "\n".join((folder / f"rank-{i}.log").read_text()[-1500:] for i in range(len(commands)))
        raise RuntimeError(f"return codes {codes}\n{tails}")


def hardened(folder: Path) -> dict:
    folder.mkdir(parents=True)
    certs = folder / "certs"
    make_certs(certs, SILOS, ["127.0.0.1"])
    ipconfig = conformance.write_ipconfig(folder / "ip.csv", SILOS + 1, conformance.free_port())
    out = folder / "out"
    base = [
        *_overrides(ipconfig),
        "comm_args.tls=on",
        "comm_args.auth=mtls",
        f"comm_args.tls_ca={certs / 'ca.pem'}",
    ]
    commands = []
    for rank in range(SILOS + 1):
        name = "server" if rank == 0 else f"silo-{rank}"
        mine = [f"comm_args.tls_cert={certs / f'{name}.pem'}", f"comm_args.tls_key={certs / f'{name}.key'}"]
        commands.append([*conformance.cli_command("run", CONFIG, [*base, *mine], out), "--rank", str(rank)])
    _run(commands, folder)
    return _round_one(out)


def fedml(folder: Path) -> dict:
    folder.mkdir(parents=True)
    port = conformance.free_port()
    ipconfig = conformance.write_ipconfig(folder / "ip.csv", SILOS + 1, port)
    out = folder / "out"
    script = str(HERE / "fedml_grpc_process.py")
    commands = []
    for rank in range(SILOS + 1):
        cmd = conformance.cli_command("run", CONFIG, _overrides(ipconfig), out)
        commands.append([cmd[0], script, *cmd[3:], "--rank", str(rank)])
    _run(commands, folder, server_port=port)
    return _round_one(out)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = Path(tempfile.mkdtemp(prefix="fedml-moon-transport-"))
    ours = hardened(folder / "hardened")
    theirs = fedml(folder / "fedml")
    for name, r in (("hardened (TLS, mTLS)", ours), ("FedML's plain gRPC", theirs)):
        log.info("%-22s round 1: %.2f s, server wire bytes %.2f MB", name, r["time_s"], r["wire_bytes"] / 1e6)
    ratio_t, ratio_b = ours["time_s"] / theirs["time_s"], ours["wire_bytes"] / theirs["wire_bytes"]
    sys.stdout.write(f"hardened_vs_fedml_time={ratio_t:.3f} hardened_vs_fedml_bytes={ratio_b:.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
