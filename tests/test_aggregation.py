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
    from fedml_moon.core.validate import upload_problem

    ref = {"w": torch.zeros(2, 3), "n": torch.zeros((), dtype=torch.long)}
    assert upload_problem({"model": {"w": torch.ones(2, 3)}}, ref) is None  # a subset (LG) is fine
    assert "NaN or Inf" in upload_problem({"model": {"w": torch.full((2, 3), float("nan"))}}, ref)
    assert "NaN or Inf" in upload_problem(
        {"model": {"w": torch.ones(2, 3)}, "c": {"w": torch.tensor([float("inf")])}}, ref
    )
    assert "is (3, 2) torch.float32, the server's is (2, 3)" in upload_problem(
        {"model": {"w": torch.ones(3, 2)}}, ref
    )
    assert "not in the server's model" in upload_problem({"model": {"x": torch.ones(1)}}, ref)
    assert upload_problem({"weights": 1}, ref) == "it has no model"
