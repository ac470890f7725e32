"""Stopped and resumed in-process, every algorithm's state comes back whole.

Each case runs a tiny standalone run three ways in this process: never interrupted; stopped abruptly
in round r + 1 after the checkpoint of round r, once that round's record was written (so metrics.jsonl
and the disk state store hold progress the checkpoint does not); resumed with `assemble(...,
resume=True)` and run to the end. The resumed run must end with the same model, bit for bit, and the
same records (timings aside) as the one never interrupted. The cases cover the memory state store,
SCAFFOLD's control variates, SOLO's models, LG-FedAvg across warm-up and local phases, FedAvgM's
server momentum, FedAdam's moments, MOON's model pools of different lengths, and batched training.
The SIGKILL tests in tests/test_resume.py do the same across processes (FedSSC).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.tiny import TINY_RUN, Stop, stop_after

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"
BASE = [
    *conformance.TINY,
    *TINY_RUN,
    "train_args.comm_round=4",
    "train_args.checkpoint_every=1",
    "validation_args.frequency_of_the_test=2",
]
LG = ["algorithm_args.warmup_rounds=2", "data_args.partition_method=hetero"]
# name: (config, overrides, the round stopped in)
CASES = {
    "scaffold-memory-store": ("scaffold", ["train_args.state_store=memory"], 2),
    "solo": ("solo", [], 2),
    # LG-FedAvg, 2 warm-up rounds of FedAvg then local layers: stopped in warm-up (the best warm-up
    # model carried over), and after it (local layers in the store, the best-so-far pool begun with
    # its start model not yet evaluated)
    "lg-stopped-in-warmup": (
        "lg",
        [*LG, "algorithm_args.warmup_start=best", "algorithm_args.report_best=true"],
        1,
    ),
    "lg-stopped-after-warmup": ("lg", [*LG, "algorithm_args.report_best=true"], 3),
    "fedavgm": ("fedavg", ["server_args.server_momentum=0.9"], 2),
    "fedadam": ("fedavg", ["server_args.server_optimizer=adam", "server_args.server_lr=0.05"], 2),
    "moon-pool-3": ("moon", ["algorithm_args.pool_size=3", "train_args.state_store=memory"], 3),
    "moon-pool-2-batched": ("moon", ["algorithm_args.pool_size=2", "train_args.parties_in_parallel=2"], 2),
}


def _records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.endswith("_time_s")} for x in lines]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_stopped_and_resumed_in_process_is_the_same_run(case, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)  # time
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)
    name, overrides, stop_in = CASES[case]
    cfg = load_config(CONFIGS / f"{name}.yaml", [*BASE, *overrides])
    ref, out = tmp_path / "ref", tmp_path / "stopped"
    assemble(cfg, ref).loop.run()

    first = assemble(cfg, out)
    stop_after(monkeypatch, first.loop, stop_in)
    with pytest.raises(Stop):
        first.loop.run()
    assert [r["round"] for r in _records(out)] == list(range(stop_in + 1))
    stopped = _summary(out)
    assert stopped["status"] == "failed" and stopped["model_file"] == "model_at_failed.pt"
    assert not (out / "final_model.pt").exists()

    again = assemble(cfg, out, resume=True)
    assert again.loop.start_round == stop_in  # the checkpoint of round stop_in - 1
    again.loop.run()

    a = torch.load(ref / "final_model.pt", weights_only=True)
    b = torch.load(out / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "another final model"
    assert _records(ref) == _records(out)
    done = _summary(out)
    assert done["status"] == "completed" and done["model_file"] == "final_model.pt"
    assert done["final_model_sha256"] == _summary(ref)["final_model_sha256"]
    assert not list(out.glob("model_at_*.pt")), "the model of the stopped run is gone"
