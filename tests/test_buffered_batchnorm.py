"""BatchNorm's running statistics under stale buffered updates stay valid: a party's statistics are
mixed into the current global model's (a convex combination, so a variance stays >= 0), never
applied as a change from the stale model it was sent. By hand (the case that drove a variance to
-19.75), and over a whole standalone run with a BatchNorm network, checked update by update; the
MPI simulation's secure buffers end with the standalone model (tests/test_buffered_modes.py)."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from fedml_moon.algorithms.base import ServerAlgorithm
from fedml_moon.config.schema import ServerArgs
from fedml_moon.core.fedbuff import Buffer, discount, restate, stat_shift
from fedml_moon.privacy.sums import Sums, contribution
from tests.support.bn_cnn import REF
from tests.support.buffered_runs import (
    BUFFERED,
    algorithm_1_sets,
    max_distance,
    read_once,  # noqa: F401 (a fixture of this module)
    run_standalone,
)
from tests.support.marks import needs_fmnist
from tests.support.tiny import train_args

STATS = ["bn.running_var"]


def _buffer(current: OrderedDict, updates: list[tuple[OrderedDict, OrderedDict, int]]) -> Buffer:
    """A buffer of (sent, upload, tau) updates, uniform r = 1, as the server adds them."""
    buffer = Buffer()
    for party, (sent, upload, tau) in enumerate(updates):
        s = discount("sqrt", tau)
        buffer.add(
            contribution({"model": upload}, {"model": sent}, {"model": "update"}, s), 1.0, tau, None, party
        )
        buffer.shifts.append((party, 1.0, stat_shift(sent, current, STATS, s)))
    return buffer


def _apply(current: OrderedDict, buffer: Buffer, restated: bool) -> OrderedDict:
    sums = Sums(buffer.weight, len(buffer), buffer.fields)
    if restated:
        restate(sums.fields["model"], sums.weight, buffer.shifts)
    server = ServerAlgorithm(None, ServerArgs(), train_args())
    server.trainable = ["w"]
    return server.aggregate_sums(current, sums)


def test_a_stale_variance_is_mixed_in_not_applied_as_a_change():
    """Version 0's variance 40, version 1's 5; a party sent version 0 uploads 5 (tau = 1, s = 1/sqrt 2).
    As a change: 5 + s (5 - 40) = -19.75. Restated: 5 + s (5 - 5) = 5. With a fresh upload of 6 beside
    it (K = 2): 5 + (s (5 - 40) + 1) / 2 = -6.87 as changes; 5 + (0 + 1) / 2 = 5.5 restated. The
    weights move as Algorithm 1 says either way."""
    v0 = OrderedDict(w=torch.tensor([1.0]), **{"bn.running_var": torch.tensor([40.0])})
    v1 = OrderedDict(w=torch.tensor([2.0]), **{"bn.running_var": torch.tensor([5.0])})
    stale = (v0, OrderedDict(w=torch.tensor([3.0]), **{"bn.running_var": torch.tensor([5.0])}), 1)
    fresh = (v1, OrderedDict(w=torch.tensor([2.5]), **{"bn.running_var": torch.tensor([6.0])}), 0)
    s = 1 / math.sqrt(2)
    cases = [
        ([stale], 5 - 35 * s, 5.0, 2 + 2 * s),
        ([stale, fresh], 5 + (1 - 35 * s) / 2, 5.5, 2 + (2 * s + 0.5) / 2),
    ]
    for updates, as_change, restated, w in cases:
        assert _apply(v1, _buffer(v1, updates), False)["bn.running_var"].item() == pytest.approx(as_change)
        new = _apply(v1, _buffer(v1, updates), True)
        assert new["bn.running_var"].item() == pytest.approx(restated)
        assert new["w"].item() == pytest.approx(w)
    assert 5 - 35 * s < 0 and 5 + (1 - 35 * s) / 2 < 0  # what the change form did


def test_fresh_updates_are_algorithm_1_itself_and_a_removed_party_takes_its_shift():
    """tau = 0 everywhere (x_sent = x): the shifts are 0 and the statistics move as every entry does;
    a party taken out of the buffer (a secure sum's placeholder) takes its shift with it."""
    x = OrderedDict(w=torch.tensor([1.0]), **{"bn.running_var": torch.tensor([4.0])})
    up = OrderedDict(w=torch.tensor([2.0]), **{"bn.running_var": torch.tensor([2.0])})
    buffer = _buffer(x, [(x, up, 0), (x, up, 0)])
    assert (
        _apply(x, buffer, True)["bn.running_var"].item() == _apply(x, buffer, False)["bn.running_var"].item()
    )
    buffer.remove(1)
    assert [p for p, _, _ in buffer.shifts] == [0]
    assert [p for p, _, _ in Buffer.from_state(buffer.state()).shifts] == [0]


def _bn_keys(model: dict) -> list[str]:
    return [k for k in model if k.endswith(("running_mean", "running_var"))]


@needs_fmnist
def test_a_batchnorm_network_buffers_its_statistics_against_the_current_model(tmp_path, monkeypatch):
    """A BatchNorm network, two parties both training, K = 2, party 0 taking 1 s and party 1 1.5 s
    (tests/test_buffered.py's Algorithm 1 run): t = 1.5 the first buffer (A, B) fresh; t = 3 the
    second holds C, one round stale (sent x0), and E (sent x1). The weights move as Algorithm 1 says;
    the running statistics are x1 + (s stat_C - s x1 + stat_E - x1) / 2, each variance >= 0."""
    sets = algorithm_1_sets(tmp_path)
    sets += [f"model_args.model={REF}"]
    spy: list = []
    final, records = run_standalone(tmp_path, "fedavg", sets, monkeypatch, spy)
    (_, x0, a), (_, _, b), (_, _, c), (_, x1, e), _ = ((p, s["model"], u["model"]) for p, s, u in spy)
    stats, s = _bn_keys(x0), 1 / math.sqrt(2)
    assert stats and [r["staleness_max"] for r in records] == [0, 1]

    def d(up: dict, base: dict, k: str) -> torch.Tensor:
        return up[k].double() - base[k].double()

    weights = [k for k in x0 if k not in stats and x0[k].is_floating_point()]
    assert max_distance({k: x0[k].double() + (d(a, x0, k) + d(b, x0, k)) / 2 for k in stats}, x1) <= 1e-6
    want = {k: x1[k].double() + (d(c, x0, k) * s + d(e, x1, k)) / 2 for k in weights}
    assert max_distance(want, final) <= 1e-6
    want = {k: x1[k].double() + (d(c, x1, k) * s + d(e, x1, k)) / 2 for k in stats}
    assert max_distance(want, final) <= 1e-6
    assert all(bool((final[k] >= 0).all()) for k in stats if k.endswith("running_var"))


@needs_fmnist
@pytest.mark.parametrize(
    "shape",
    [
        ["train_args.client_num_in_total=3", "server_args.buffer_size=1"],
        [
            "train_args.client_num_in_total=4",
            "server_args.buffer_size=3",
            "privacy_args.secure_aggregation=true",
        ],
    ],
    ids=["plain", "secure"],
)
def test_many_stale_buffers_keep_every_variance_within_its_inputs(shape, tmp_path, monkeypatch):
    """3 parties training at once at lognormal speeds, K = 1, 6 rounds; and 4 under secure aggregation
    with K = 3 (the party's side sums its change, the server restates the buffer's sum): every applied
    running_var lies between the
    model's before it and the update's own (a convex combination), so the last one is never below the
    least variance the first model or any update held."""
    sets = [*BUFFERED, *shape, "train_args.client_num_per_round=3", "server_args.concurrency=3"]
    sets += ["train_args.party_speed=lognormal", "train_args.comm_round=6"]
    sets += [f"model_args.model={REF}", "train_args.learning_rate=0.1"]
    spy: list = []
    final, records = run_standalone(tmp_path, "fedavg", sets, monkeypatch, spy)
    assert any(r["staleness_max"] > 0 for r in records)
    inputs = [spy[0][1]["model"]] + [u["model"] for _, _, u in spy]  # the first model, every update
    for key in [k for k in final if k.endswith("running_var")]:
        low = torch.stack([m[key] for m in inputs]).min(dim=0).values
        assert bool((final[key] >= low - 1e-6).all()), key
