"""An operator's cross-silo run (127.0.0.1): the server killed with SIGKILL mid-run and started again
with --resume, the silos left running, ends with the final model of a run never interrupted (gRPC and
MQTT + S3); silos take the run's config from the server, so only the server is given --set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.conformance import recovery
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
RUN = [  # the run's settings: given to the server only
    "data_args.max_train_samples=600",
    "data_args.max_test_samples=200",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=12",  # the kill comes after round 2: many rounds are still to run
    "train_args.batch_size=32",
    "train_args.learning_rate=0.05",
    "train_args.checkpoint_every=2",
    "validation_args.frequency_of_the_test=2",
    "validation_args.local_test=true",
]
LOCAL = [  # each process's own: how it talks, how many threads, no W&B
    "common_args.training_type=cross_silo",
    "comm_args.heartbeat_s=1",
    "comm_args.timeout_s=120",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]


def _records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    drop = ("_time_s", "wire_")
    return [{k: v for k, v in json.loads(x).items() if not any(d in k for d in drop)} for x in lines]


def _drill(tmp_path: Path, comm: list[str], kill_silo: int | None = None) -> Path:
    drill = recovery.server_restart(tmp_path, CONFIG, RUN, [*LOCAL, *comm], kill_silo)
    assert drill.returncodes == [0, 0, 0, 0], {k: v[-2500:] for k, v in drill.logs.items()}
    for r in (1, 2, 3):
        if r == kill_silo:
            text = drill.logs[f"silo-{r}-again.log"]
        else:
            text = drill.logs[f"silo-{r}.log"]
            assert text.count("for a server to welcome it") == 1  # said once, not every second
        assert "resumed its parties from the checkpoint of round" in text
        assert "takes" in text and "train_args.comm_round" in text  # from the server, not from --set
    assert "resuming after the checkpoint of round" in drill.logs["server-2.log"]
    assert drill.recovery_s < 60, drill.recovery_s
    return drill.out_dir


def _assert_same_as(ref: Path, out: Path) -> None:
    a = torch.load(ref / "final_model.pt", weights_only=True)
    b = torch.load(out / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends with another model"
    assert _records(ref) == _records(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same run, never interrupted (the standalone loop: every mode gives its model)."""
    folder = tmp_path_factory.mktemp("reference")
    ref = conformance.run_mode(
        "standalone",
        CONFIG,
        [*RUN, "device_args.torch_threads=1", "tracking_args.enable_wandb=false"],
        folder,
    )
    assert ref.ok, ref.tail()
    return ref.out_dir


def test_grpc_server_killed_and_resumed_with_silos_untouched_is_the_same_run(tmp_path, reference):
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 1, conformance.free_port())  # the server's row
    comm = ["comm_args.backend=GRPC", f"comm_args.grpc_ipconfig_path={ipconfig}"]
    _assert_same_as(reference, _drill(tmp_path, comm))


def test_mqtt_s3_server_and_one_silo_killed_and_restarted_is_the_same_run(tmp_path, reference):
    """Restart only what died: the server (with --resume) and silo 3 (as it was first started); the
    other silos stay up. Silo 3 loads its own checkpoint of the round the server resumes from."""
    with conformance.services(tmp_path / "services") as svc:
        comm = ["comm_args.backend=MQTT_S3", f"comm_args.run_id=op-{conformance.free_port()}", *svc.overrides]
        out = _drill(tmp_path, comm, kill_silo=3)
    _assert_same_as(reference, out)
