"""How long an operator's cross-silo run takes to recover, with the default heartbeats (5 s).

Setting: MOON on Fashion-MNIST (6,000 training images), 3 silos and a server on 127.0.0.1, 8 rounds of
1 local epoch, a checkpoint every 2 rounds, every process on 1 PyTorch thread. Measured:
  server restart (gRPC, then MQTT + S3 with mosquitto and moto started here): the server is killed
  with SIGKILL while round 3 trains and started again at once with --resume, the silos left running;
  `rejoin` = from that restart until every silo is welcomed by the new server process, `recovery` =
  until the first round past those recorded before the kill (the rounds since the checkpoint are run
  again); the run must end with exit code 0 everywhere.
  silo loss (gRPC, default quorum: half of the sampled parties): a silo is killed with SIGKILL; the
  seconds until the server's round goes on without it.
Last line: grpc_rejoin_s=... grpc_recovery_s=... mqtt_s3_rejoin_s=... mqtt_s3_recovery_s=... silo_loss_s=...

Run: .venv/bin/python benchmarks/recovery.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

from fedml_moon import conformance
from fedml_moon.conformance import recovery

log = logging.getLogger("recovery")
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
RUN = [
    "data_args.max_train_samples=6000",
    "data_args.max_test_samples=2000",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=3",
    "train_args.comm_round=8",
    "train_args.epochs=1",
    "train_args.checkpoint_every=2",
]
LOCAL = [
    "common_args.training_type=cross_silo",
    "comm_args.timeout_s=300",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]


def drill(folder: Path, comm: list[str]) -> recovery.Drill:
    result = recovery.server_restart(folder, CONFIG, RUN, [*LOCAL, *comm], down_s=0.0, timeout_s=300)
    if result.returncodes != [0, 0, 0, 0]:
        raise SystemExit(
            f"the run did not complete after the restart: {result.returncodes} (logs in {folder})"
        )
    return result


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fedml-moon-recovery-") as tmp:
        root = Path(tmp)
        ipconfig = conformance.write_ipconfig(root / "ip.csv", 1, conformance.free_port())
        grpc = ["comm_args.backend=GRPC", f"comm_args.grpc_ipconfig_path={ipconfig}"]
        (root / "grpc").mkdir()
        result = drill(root / "grpc", grpc)
        figures.update(grpc_rejoin_s=result.rejoin_s, grpc_recovery_s=result.recovery_s)
        with conformance.services(root / "services") as svc:
            mqtt = [
                "comm_args.backend=MQTT_S3",
                f"comm_args.run_id=drill-{conformance.free_port()}",
                *svc.overrides,
            ]
            (root / "mqtt").mkdir()
            result = drill(root / "mqtt", mqtt)
        figures.update(mqtt_s3_rejoin_s=result.rejoin_s, mqtt_s3_recovery_s=result.recovery_s)
        (root / "loss").mkdir()
        codes, noticed = recovery.silo_loss(root / "loss", CONFIG, [*RUN, *LOCAL, *grpc], timeout_s=300)
        if codes != [0, 0, 0]:
            raise SystemExit(f"the run did not complete without the dead silo: {codes}")
        figures["silo_loss_s"] = noticed
    for name, value in figures.items():
        log.info("%-22s %6.1f s", name, value)
    sys.stdout.write(" ".join(f"{k}={v:.1f}" for k, v in figures.items()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
