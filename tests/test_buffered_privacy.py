"""Privacy per buffer (`server_args.aggregation: buffered` with `privacy_args`): each buffer is a
secure sum of its K parties' clipped, discounted vectors, with the crowd rules of a synchronous round
and at most one update per party; DP's accountant charges each buffer as a release of its parties,
with no amplification by sampling claimed (a buffer's parties are the first to finish, not a uniform
sample), and a run stops before the buffer that would pass `dp_target_epsilon`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

from fedml_moon.privacy.accountant import ORDERS
from fedml_moon.privacy.party import Plan, PrivacyError, party_vector
from tests.support.buffered_runs import (
    BUFFERED,
    SECURE,
    max_distance,
    read_once,  # noqa: F401 (a fixture of this module)
    run_standalone,
)
from tests.support.marks import needs_fmnist

DP = ["privacy_args.dp_clip_norm=1.0", "privacy_args.dp_noise_multiplier=1.0", "privacy_args.dp_delta=1e-3"]


def test_a_party_clips_then_discounts_its_update_and_never_its_sums():
    """Delta = (3, 4) and a prototype (2), norm sqrt(29), clipped together to C = 1; then the update, not
    the prototype (a class mean, not a change), discounted by s = 1/2: (1.5, 2, 2) / sqrt(29)."""
    received = {"model": {"w": torch.zeros(2)}}
    upload = {"model": {"w": torch.tensor([3.0, 4.0])}, "proto": torch.tensor([2.0])}
    plan = Plan({"model": "update", "proto": "sum"}, clip=1.0, discount=0.5)
    vector = party_vector(upload, received, plan)
    assert vector.norm == pytest.approx(math.sqrt(29))
    want = torch.tensor([1.5, 2.0, 2.0], dtype=torch.float64) / math.sqrt(29)
    assert [e[0] for e in vector.entries] == ["model", "proto"] and torch.allclose(vector.vector, want)
    assert Plan.from_dict(plan.to_dict()) == plan
    for bad in (0.0, 1.5, -0.5):
        with pytest.raises(PrivacyError, match="discount"):
            Plan.from_dict({**plan.to_dict(), "discount": bad})


@needs_fmnist
def test_a_secure_buffer_is_algorithm_1_with_one_update_per_party(tmp_path, monkeypatch):
    """Four parties training at once (1, 2, 3 and 4.5 s), K = 3, secure aggregation. t=1, 2: parties 0
    and 1 into the buffer, neither given work again while its update waits there; t=3: party 2 fills it,
    x1 = x0 + (d0 + d1 + d2) / 3, and 0, 1, 2 start from x1. t=4: party 0; t=4.5: party 3, from x0,
    one round stale; t=5: party 1 fills it: x2 = x1 + (d0' + d3 / sqrt(2) + d1') / 3, to the
    fixed-point grid of the secure sum."""
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("0,1\n1,2\n2,3\n3,4.5\n")
    sets = [*BUFFERED, *SECURE, "train_args.client_num_in_total=4", "train_args.client_num_per_round=4"]
    sets += [
        "server_args.buffer_size=3",
        "train_args.party_speed=file",
        f"train_args.party_speed_file={speeds}",
    ]
    spy: list = []
    final, records = run_standalone(tmp_path, "fedavg", [*sets, "train_args.comm_round=2"], monkeypatch, spy)
    assert [p for p, _, _ in spy] == [0, 1, 2, 3, 0, 1, 2]
    x0, x1 = spy[0][1]["model"], spy[4][1]["model"]
    up = {i: spy[i][2]["model"] for i in range(7)}

    def d(i: int, base: dict, k: str) -> torch.Tensor:
        return up[i][k].double() - base[k].double()

    want1 = {k: x0[k].double() + (d(0, x0, k) + d(1, x0, k) + d(2, x0, k)) / 3 for k in x0}
    assert max_distance(want1, x1) <= 1e-4
    want2 = {k: x1[k].double() + (d(4, x1, k) + d(3, x0, k) / math.sqrt(2) + d(5, x1, k)) / 3 for k in x1}
    assert max_distance(want2, final) <= 1e-4
    assert [(r["sim_time_s"], r["staleness_max"]) for r in records] == [(3.0, 0), (5.0, 1)]
    assert "rejected_parties" not in records[0] or not records[0]["rejected_parties"]


@needs_fmnist
def test_the_accountant_charges_each_buffer_to_its_parties_without_sampling(tmp_path, monkeypatch):
    """DP under secure aggregation, K = 3 of 6 parties, 5 training at once at lognormal speeds: every
    release in the ledger is 3 distinct parties at sigma; epsilon against the server is the RDP
    composition (dp_accounting, a shift of 2C each) of the releases of the party in most buffers,
    and the release's epsilon claims nothing more (no amplification by sampling)."""
    sets = [*BUFFERED, *SECURE, *DP, "train_args.client_num_in_total=6", "train_args.client_num_per_round=5"]
    sets += ["server_args.buffer_size=3", "train_args.party_speed=lognormal", "train_args.comm_round=4"]
    _, records = run_standalone(tmp_path, "fedavg", sets, monkeypatch)
    ledger = [json.loads(line) for line in (tmp_path / "privacy_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == len(records) == 4
    assert all(len(set(r["parties"])) == 3 and r["sigma"] == 1.0 for r in ledger)
    most = max(sum(p in r["parties"] for r in ledger) for p in range(6))
    accountant = RdpAccountant(list(ORDERS), NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_event.GaussianDpEvent(1.0 / 2), most)  # replacing a party: a shift of 2C
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dp_epsilon_server"] == pytest.approx(accountant.get_epsilon(1e-3), rel=1e-6)
    assert summary["dp_epsilon_release"] == summary["dp_epsilon_server"]


@needs_fmnist
def test_a_buffer_that_would_pass_the_target_epsilon_is_never_released(tmp_path, monkeypatch, caplog):
    """With dp_target_epsilon between the epsilon of 1 and of 2 releases of one party, every party in
    every buffer (K = 3 of 3): the first buffer is applied, the second is not, and the run stops."""
    sets = [*BUFFERED, *SECURE, *DP, "train_args.client_num_in_total=3", "train_args.client_num_per_round=3"]
    one, two = (RdpAccountant(list(ORDERS), NeighboringRelation.ADD_OR_REMOVE_ONE) for _ in range(2))
    one.compose(dp_event.GaussianDpEvent(1.0 / 2), 1)
    two.compose(dp_event.GaussianDpEvent(1.0 / 2), 2)
    target = (one.get_epsilon(1e-3) + two.get_epsilon(1e-3)) / 2
    _, records = run_standalone(
        tmp_path, "fedavg", [*sets, f"privacy_args.dp_target_epsilon={target}"], monkeypatch
    )
    ledger = (tmp_path / "privacy_ledger.jsonl").read_text().splitlines()
    assert len(records) == len(ledger) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["dp_epsilon_server"] <= target
    assert "the next buffer's sum would pass epsilon" in caplog.text


ALGORITHMS = {  # those whose sums hold more than the model, or weigh parties their own way
    "moon": [],
    "fedssc": ["algorithm_args.prototype_mode=mean"],
    "lg": ["algorithm_args.warmup_rounds=0", "data_args.partition_method=hetero"],
}


@needs_fmnist
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_a_secure_buffered_run_is_the_plain_buffered_run(name, tmp_path, monkeypatch):
    """K = concurrency = 3 of 4 parties at equal speeds: each buffer is the 3 parties given work
    together, so the one-update-per-party rule never binds and the two runs draw the same parties;
    the secure sums give the plain buffers' models to the fixed-point grid."""
    sets = [
        *BUFFERED,
        *ALGORITHMS[name],
        "train_args.client_num_in_total=4",
        "train_args.client_num_per_round=3",
    ]
    sets += ["train_args.party_speed=constant", "validation_args.local_test=false", "train_args.comm_round=2"]
    plain, a = run_standalone(tmp_path / "plain", name, sets, monkeypatch)
    secure, b = run_standalone(tmp_path / "secure", name, [*sets, *SECURE], monkeypatch)
    assert max_distance(plain, secure) <= 1e-4
    assert [r["sim_time_s"] for r in a] == [r["sim_time_s"] for r in b] == [1.0, 2.0]
