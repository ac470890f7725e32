"""One implementation, every mode: the same seed gives the same final model and the same metrics in
the standalone loop, the MPI simulation (3 parties on 2 workers, 2 sampled per round), cross-silo over
MPI, cross-silo over gRPC (silos started before the server) and MQTT + S3 (a real mosquitto and a
moto S3 endpoint on 127.0.0.1), down to the final model's digest in summary.json. Real processes
through the real command line.

The data are a site's own: Fashion-MNIST images written as per-party PNG folders, each party its own
class mix (a natural partition, `data_args.partition_method: natural`). The simulations read every
party; in the cross-silo modes each silo reads its own party's folder only and the server none (the
parties test the global model on their own splits and report counts: the same figures). The public
data sets' seeded partitions run through every mode in tests/test_secure_modes.py, the contributor
kit's check and the guide's commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.partition_file import load_partition_file
from tests.support.site_data import party_folders, site_sets

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
ROOT = Path(__file__).resolve().parent.parent
# FedAvg and FedProx are left out: FedAvg's server is MOON's and its party side is MOON's without the
# contrastive term, FedProx differs from FedAvg only in its party-side loss, which every mode runs in
# the same engine; the example plugin's `fedml-moon check` (tests/test_contributor_kit.py) runs a
# FedProx, on FedAvg's server, through every mode.
ALGORITHMS = {
    "moon": ("config/fashion_mnist/moon.yaml", ["tracking_args.plots=true"]),  # the others draw none
    "fedssc": ("config/fashion_mnist/fedssc.yaml", []),
    "scaffold": ("config/fashion_mnist/scaffold.yaml", []),
    "lg": (  # one FedAvg warm-up round, then LG rounds (local layers stay with their party)
        "config/fashion_mnist/lg.yaml",
        ["algorithm_args.warmup_rounds=1", "train_args.batch_size=32"],
    ),
}
PARTIES = [  # the conformance suite's tiny run on the whole of each party's folder
    *(s for s in conformance.TINY if not s.startswith("data_args.max_")),
    *site_sets(),
    "data_args.dataset=imagefolder",
    "data_args.partition_method=natural",
]


@pytest.fixture(scope="module")
def parties(tmp_path_factory) -> Path:
    return party_folders(tmp_path_factory.mktemp("parties"), per_party=150, n_test=50)


@pytest.fixture(scope="module")
def loopback_services(tmp_path_factory):
    with conformance.services(tmp_path_factory.mktemp("services")) as svc:
        yield svc


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_same_model_and_metrics_in_every_mode(algorithm, tmp_path, loopback_services, parties):
    config, extra = ALGORITHMS[algorithm]
    overrides = [*PARTIES, f"data_args.data_cache_dir={parties}", *extra]
    ref = conformance.run_mode("standalone", ROOT / config, overrides, tmp_path)
    assert ref.ok, ref.tail()
    ref_states = conformance.party_states(ref.out_dir)
    ref_digest = json.loads((ref.out_dir / "summary.json").read_text())["final_model_sha256"]
    assert _pictures(ref.out_dir) == _drawn("standalone", "tracking_args.plots=true" in extra, ref.out_dir)
    trained = {p for chosen in sample_schedule(3, 2, 3, seed=0) for p in chosen}
    assert sorted(ref_states) == sorted(f"party_{p}.pt" for p in trained)
    for mode in conformance.MODES[1:]:
        run = conformance.run_mode(mode, ROOT / config, overrides, tmp_path, loopback_services)
        assert run.ok, f"{mode}: return codes {run.returncodes}\n{run.tail()}"
        diff, problems = conformance.compare(ref, run)
        assert diff <= 1e-5, f"{mode}: final models differ by {diff}"
        assert not problems, f"{mode}: {problems[:5]}"
        digest = json.loads((run.out_dir / "summary.json").read_text())["final_model_sha256"]
        assert digest == ref_digest, f"{mode}: another final model digest in summary.json"
        assert _pictures(run.out_dir) == _drawn(mode, "tracking_args.plots=true" in extra, run.out_dir), mode
        states = conformance.party_states(run.out_dir)  # each party's state, wherever its worker kept it
        assert states.keys() == ref_states.keys(), mode
        assert all(conformance.same_tree(ref_states[k], states[k]) for k in states), (
            f"{mode}: a party's state differs"
        )
    counts = load_partition_file(ref.out_dir / "partition.json").counts.tolist()
    assert [sum(1 for n in row if n) for row in counts] == [8, 6, 5]  # each party's own class mix


def _pictures(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.png"))


def _drawn(mode: str, plots: bool, out: Path) -> list[str]:
    """The pictures a run draws: none with tracking_args.plots false, in any process; else the
    accuracy curve at the top and the partition once: the server's in the simulations (where the
    partition is the server's), each silo's own under rank-<r>/ in the cross-silo modes (where each
    silo reads its own party's folder and the server holds no data)."""
    if not plots:
        return []
    if mode in ("standalone", "mpi-simulation"):
        return ["accuracy.png", "partition.png"]
    silos = sorted(p.name for p in out.glob("rank-*") if p.name != "rank-0")
    assert len(silos) == 3, silos
    return sorted(["accuracy.png", *(f"{silo}/partition.png" for silo in silos)])
