"""Library networks in runs, as a team with its own 32x32 RGB images runs them: Fashion-MNIST
written as three parties' RGB PNG folders (the grey in three channels, resized by the reader),
MOON for two rounds with torchvision's ResNet-18 (BatchNorm) and timm's ViT-Tiny (LayerNorm; built for 32x32)
in the standalone simulation, the MPI simulation and cross-silo over gRPC (real processes on
127.0.0.1), the same final model in each; both through secure aggregation, DP and a robust rule;
LG-FedAvg with ResNet-18's last block global; a model plugin through `fedml-moon check`."""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fedml_moon import conformance
from fedml_moon.conformance import party_states
from fedml_moon.conformance.inprocess import quiet_run
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.site_data import CLASSES, party_folders

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
pytest.importorskip("timm")
ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "networks" / "resnet18.yaml"
NETWORKS = ["torchvision:resnet18", "timm:vit_tiny_patch16_224"]
MODES = ("mpi-simulation", "cross-silo-grpc")


@pytest.fixture(scope="module")
def rgb(tmp_path_factory) -> Path:
    return party_folders(tmp_path_factory.mktemp("rgb"), per_party=40, n_test=20, mode="RGB")


def _run(rgb: Path, model: str, *extra: str) -> list[str]:
    return [
        f"data_args.data_cache_dir={rgb}",
        f"data_args.classes=[{','.join(CLASSES)}]",
        f"model_args.model={model}",
        "train_args.comm_round=2",
        "train_args.client_num_per_round=2",
        "train_args.batch_size=16",
        "train_args.state_store=disk",
        "device_args.torch_threads=1",
        *extra,
    ]


@pytest.mark.parametrize("model", NETWORKS)
def test_moon_with_a_library_network_ends_on_one_model_in_every_mode(tmp_path, rgb, model):
    run = _run(rgb, model)
    ref = conformance.run_mode("standalone", CONFIG, run, tmp_path)
    assert ref.ok, ref.tail()
    for mode in MODES:
        other = conformance.run_mode(mode, CONFIG, run, tmp_path)
        assert other.ok, other.tail()
        diff, metrics = conformance.compare(ref, other)
        assert diff <= 1e-5 and not metrics, (mode, diff, metrics)
    assert "training on cpu" in ref.tail(60)


def test_a_dropout_network_ends_on_one_model_in_the_simulations(tmp_path, rgb):
    """MobileNetV3-Small keeps its dropout before the removed classifier: each party's draws are its
    own and its round's, so the MPI simulation (parties on other workers, in another order) ends
    on the standalone model."""
    run = _run(rgb, "torchvision:mobilenet_v3_small")
    ref = conformance.run_mode("standalone", CONFIG, run, tmp_path)
    assert ref.ok, ref.tail()
    assert "this network draws random numbers" not in ref.tail(80)  # a CPU: one at a time anyway
    other = conformance.run_mode("mpi-simulation", CONFIG, run, tmp_path)
    assert other.ok, other.tail()
    diff, metrics = conformance.compare(ref, other)
    assert diff <= 1e-5 and not metrics, (diff, metrics)


def test_a_dropout_network_killed_after_a_checkpoint_resumes_as_the_uninterrupted_run(tmp_path, rgb):
    from fedml_moon.conformance.inprocess import stopped_run

    run = [*_run(rgb, "torchvision:mobilenet_v3_small"), "train_args.checkpoint_every=1"]
    whole = conformance.run_mode("standalone", CONFIG, run, tmp_path / "whole")
    assert whole.ok, whole.tail()
    stopped = tmp_path / "stopped"
    torch.manual_seed(12345)  # whatever drew before: the resumed party's draws are its own
    assert stopped_run(CONFIG, run, stopped, after=0) == ""
    cmd = [*conformance.cli_command("simulate", CONFIG, run, stopped), "--resume", str(stopped)]
    env = {**os.environ, **conformance.process_env(tmp_path)}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a = torch.load(whole.out_dir / "final_model.pt", weights_only=True)
    b = torch.load(stopped / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model", NETWORKS)
def test_secure_aggregation_of_a_library_network_equals_the_plain_one(tmp_path, rgb, model):
    outcome = conformance.secure_vs_plain(CONFIG, _run(rgb, model), tmp_path, 3)
    assert outcome.ok, (outcome.problems, outcome.error)


@pytest.mark.parametrize(
    "model, extra",
    [
        ("torchvision:resnet18", ["privacy_args.dp_buffers=average"]),  # BatchNorm's statistics
        ("timm:vit_tiny_patch16_224", []),  # LayerNorm holds no buffers: nothing to refuse
    ],
)
def test_dp_and_a_robust_rule_run_a_library_network(tmp_path, rgb, model, extra):
    dp = ["privacy_args.dp_clip_norm=1.0", "privacy_args.dp_noise_multiplier=0.5", *extra]
    for name, sets in (("dp", dp), ("median", ["server_args.robust_aggregation=median"])):
        with quiet_run(CONFIG, _run(rgb, model, *sets), tmp_path / name) as run:
            run.loop.run()
            final = run.loop.server.aggregator.global_state
        assert all(torch.isfinite(v.float()).all() for v in final.values()), name
        assert math.isfinite(run.loop.server.recorder.records[-1]["test_loss"]), name


def test_lg_fedavg_keeps_the_layers_below_resnet18s_last_block_at_each_party(tmp_path, rgb):
    raw = yaml.safe_load(CONFIG.read_text())
    raw["train_args"]["algorithm"] = "lg"
    raw["algorithm_args"] = {"global_prefixes": ["encoder.net.layer4", "head", "classifier"]}
    config = tmp_path / "lg.yaml"
    config.write_text(yaml.safe_dump(raw))
    run = [*_run(rgb, "torchvision:resnet18"), "train_args.client_num_per_round=3"]
    ref = conformance.run_mode("standalone", config, run, tmp_path)
    assert ref.ok, ref.tail()
    states = [s for _, s in sorted(party_states(ref.out_dir).items())]
    assert len(states) == 3, list(party_states(ref.out_dir))
    keys = list(states[0]["local"])
    assert "encoder.net.conv1.weight" in keys and "encoder.net.layer3.1.bn2.running_var" in keys
    assert not any(k.startswith(("encoder.net.layer4", "head", "classifier")) for k in keys)
    first, second = (s["local"]["encoder.net.conv1.weight"] for s in states[:2])
    assert not torch.equal(first, second)  # each party's own stem, trained on its own images


def test_a_model_plugin_passes_fedml_moon_check_as_the_how_to_shows_it(tmp_path):
    from tests.support.doc_commands import NETWORK_CHECK

    command = shlex.split(NETWORK_CHECK)
    command[0] = str(ROOT / command[0])
    if not Path(command[0]).exists():  # an installation without the repository's .venv
        command[0] = str(Path(sys.executable).with_name("fedml-moon"))
    env = {**os.environ, **conformance.process_env(tmp_path)}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "moon: 16 of 16 checks passed" in done.stdout
    built = "examples/networks/groupnorm_cnn.py:encoder: (1, 28, 28) -> [batch, 128]"
    assert f"PASS  the network is built for the data's inputs ({built})" in done.stdout
