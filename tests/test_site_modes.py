"""Per-party image folders (a natural partition, each party its own class mix) end on the same final
model and metrics in the standalone simulation and the MPI simulation (3 parties on 2 workers, 2
sampled per round), for MOON, FedSSC, LG-FedAvg and SCAFFOLD: real processes, the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.site_data import party_folders, site_sets

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = {
    "moon": ("config/fashion_mnist/moon.yaml", []),
    "fedssc": ("config/fashion_mnist/fedssc.yaml", []),
    "scaffold": ("config/fashion_mnist/scaffold.yaml", []),
    "lg": ("config/fashion_mnist/lg.yaml", ["algorithm_args.warmup_rounds=1"]),
}
SETTINGS = [
    "data_args.dataset=imagefolder",
    "data_args.partition_method=natural",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=3",
    "train_args.epochs=1",
    "train_args.batch_size=32",
    "train_args.learning_rate=0.05",
    "train_args.state_store=disk",
    "tracking_args.enable_wandb=false",
    "validation_args.local_test=true",
]


@pytest.fixture(scope="module")
def parties(tmp_path_factory) -> Path:
    return party_folders(tmp_path_factory.mktemp("parties"), per_party=150, n_test=50)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_per_party_folders_give_the_same_model_in_standalone_and_mpi_simulation(algorithm, parties, tmp_path):
    config, extra = ALGORITHMS[algorithm]
    overrides = [*site_sets(), *SETTINGS, f"data_args.data_cache_dir={parties}", *extra]
    ref = conformance.run_mode("standalone", ROOT / config, overrides, tmp_path)
    assert ref.ok, ref.tail()
    mpi = conformance.run_mode("mpi-simulation", ROOT / config, overrides, tmp_path)
    assert mpi.ok, mpi.tail()
    diff, problems = conformance.compare(ref, mpi)
    assert diff <= 1e-5 and not problems, (diff, problems[:5])
    digests = [json.loads((r.out_dir / "summary.json").read_text())["final_model_sha256"] for r in (ref, mpi)]
    assert digests[0] == digests[1]
    counts = json.loads((ref.out_dir / "partition.json").read_text())["counts"]
    assert [sum(1 for n in row if n) for row in counts] == [8, 6, 5]  # each party's own class mix
