"""Server arithmetic: weighted averaging and server momentum, by hand."""

from collections import OrderedDict

import pytest
import torch

from fedml_moon.core.aggregation import ServerMomentum, payload_nbytes, weighted_average
from fedml_moon.core.schedule import sample_schedule


def test_weighted_average_by_sample_count_includes_buffers():
    a = OrderedDict(w=torch.tensor([0.0, 10.0]), n=torch.tensor(2))
    b = OrderedDict(w=torch.tensor([4.0, 0.0]), n=torch.tensor(6))
    out = weighted_average([a, b], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([3.0, 2.5]))
    assert out["n"].dtype == torch.int64 and out["n"].item() == 5  # 0.25*2 + 0.75*6


def test_moon_style_momentum_two_steps():
    m = ServerMomentum(0.5, "moon")
    old = OrderedDict(w=torch.tensor([1.0]))
    new = m.step(old, OrderedDict(w=torch.tensor([0.0])))  # v = 0.5*1 = 0.5, w = 0.5
    assert new["w"].item() == pytest.approx(0.5)
    new2 = m.step(new, OrderedDict(w=torch.tensor([0.5])))  # delta 0, v = 0.25, w = 0.25
    assert new2["w"].item() == pytest.approx(0.25)


def test_fedavgm_style_momentum():
    m = ServerMomentum(0.9, "fedavgm", lr=1.0)
    old = OrderedDict(w=torch.tensor([1.0]))
    new = m.step(old, OrderedDict(w=torch.tensor([0.0])))  # v = 1, w = 0
    assert new["w"].item() == pytest.approx(0.0)
    new2 = m.step(new, OrderedDict(w=torch.tensor([0.0])))  # v = 0.9, w = -0.9
    assert new2["w"].item() == pytest.approx(-0.9)


def test_zero_momentum_moon_style_is_plain_average():
    m = ServerMomentum(0.0, "moon")
    out = m.step(OrderedDict(w=torch.tensor([5.0])), OrderedDict(w=torch.tensor([2.0])))
    assert out["w"].item() == pytest.approx(2.0)


def test_payload_nbytes_counts_tensor_bytes_only():
    payload = {"model": {"a": torch.zeros(10), "b": torch.zeros(2, dtype=torch.float64)}, "party_id": 3}
    assert payload_nbytes(payload) == 10 * 4 + 2 * 8


def test_schedule_is_seeded_and_full_participation_is_everyone():
    assert sample_schedule(4, 4, 2, seed=1) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    a, b = sample_schedule(10, 3, 5, seed=7), sample_schedule(10, 3, 5, seed=7)
    assert a == b and all(len(set(r)) == 3 for r in a)
    assert sample_schedule(10, 3, 5, seed=8) != a


def test_unusable_uploads_are_named_and_left_out():
    """An upload must hold exactly what the server algorithm's spec names: every tensor with its
    shape and dtype (the full model, not only the keys present), its party id, finite values."""
    from fedml_moon.core.validate import upload_problem

    glob = {"w": torch.zeros(2, 3), "n": torch.zeros((), dtype=torch.long)}
    spec = {"model": glob, "party_id": 4}
    good = {"model": {"w": torch.ones(2, 3), "n": torch.tensor(3)}, "party_id": 4}
    assert upload_problem(good, spec) is None
    assert upload_problem({**good, "metrics": {"loss": 0.5, "l_con": 1}}, spec) is None
    assert "lacks ['n']" in upload_problem({**good, "model": {"w": torch.ones(2, 3)}}, spec)
    assert "NaN or Inf" in upload_problem(
        {**good, "model": {**good["model"], "w": torch.full((2, 3), 1e400)}}, spec
    )
    assert (
        upload_problem(
            {**good, "model": {**good["model"], "w": torch.full((2, 3), float("nan"))}}, spec, finite=False
        )
        is None
    )
    assert "upload.model.w is (3, 2) torch.float32, the server's is (2, 3)" in upload_problem(
        {**good, "model": {**good["model"], "w": torch.ones(3, 2)}}, spec
    )
    assert "upload.model.n is (3,) torch.int64" in upload_problem(
        {**good, "model": {**good["model"], "n": torch.ones(3, dtype=torch.long)}}, spec
    )
    assert "has unexpected ['x']" in upload_problem(
        {**good, "model": {**good["model"], "x": torch.ones(1)}}, spec
    )
    assert "upload.party_id is 5, not 4" in upload_problem({**good, "party_id": 5}, spec)
    assert "upload.party_id is '4', not 4" in upload_problem({**good, "party_id": "4"}, spec)
    assert "has unexpected ['c']" in upload_problem({**good, "c": {"w": torch.ones(2, 3)}}, spec)
    assert "metrics.loss is nan" in upload_problem({**good, "metrics": {"loss": float("nan")}}, spec)
    assert "not a name" in upload_problem({**good, "metrics": {"a b": 1.0}}, spec)
    assert upload_problem({"weights": 1}, spec) == "it has no model"


def test_reports_are_bound_to_their_party_and_range():
    from fedml_moon.core.validate import report_problem

    assert report_problem({"party_id": 2, "local_test_acc": 0.5}, 2, None) is None
    assert "party_id 3 is not 2" in report_problem({"party_id": 3, "local_test_acc": 0.5}, 2, None)
    assert "not a number in [0, 1]" in report_problem({"party_id": 2, "local_test_acc": 7.0}, 2, None)
    assert "are not" in report_problem({"party_id": 2, "local_test_acc": 0.5, "personal": None}, 2, None)
    local = {"head.w": torch.zeros(2)}
    assert report_problem({"party_id": 2, "local_test_acc": 0.5, "personal": None}, 2, local) is None
    ok = {"party_id": 2, "local_test_acc": 0.5, "personal": {"head.w": torch.ones(2)}}
    assert report_problem(ok, 2, local) is None
    assert "lacks ['head.w']" in report_problem({**ok, "personal": {}}, 2, local)
    assert "NaN or Inf" in report_problem(
        {**ok, "personal": {"head.w": torch.full((2,), float("inf"))}}, 2, local
    )
