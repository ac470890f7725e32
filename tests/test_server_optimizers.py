"""The server's optimisers (FedOpt: Reddi et al., ICLR 2021, Algorithm 2) and FedAsync (Xie et al.
2019) as a rule of buffered runs: each step by hand, buffers left to the average, the refusals naming
their key, a FedAsync run checked update by update, and FedAsync with FedAdam in the MPI simulation
ending with the standalone run's model. Resumes: tests/test_resume_algorithms.py (FedAdam, sync) and
tests/test_buffered.py (FedYogi, buffered)."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.algorithms.base import ServerAlgorithm
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError, ServerArgs
from fedml_moon.core.server_opt import AdaptiveServer
from tests.support.buffered_runs import (
    BUFFERED,
    CONFIGS,
    max_distance,
    read_once,  # noqa: F401 (a fixture of this module)
    run_standalone,
    standalone_and_mpi,
)
from tests.support.marks import needs_fmnist
from tests.support.tiny import train_args

B1, B2, TAU, ETA = 0.9, 0.99, 1e-3, 0.1


def _by_hand(kind: str, deltas: list[float]) -> float:
    """Algorithm 2 on one scalar from x = 1, written out: m, v from tau^2, x += eta m / (sqrt v + tau)."""
    x, m, v = 1.0, 0.0, TAU**2
    for d in deltas:
        m = B1 * m + (1 - B1) * d
        if kind == "adagrad":
            v = v + d * d
        elif kind == "adam":
            v = B2 * v + (1 - B2) * d * d
        else:  # yogi
            v = v - (1 - B2) * d * d * math.copysign(1.0, v - d * d)
        x = x + ETA * m / (math.sqrt(v) + TAU)
    return x


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_each_step_is_algorithm_2_by_hand(kind):
    """Two rounds whose average moves the weight by +0.5, then by -0.2 (from wherever it is): the
    first step of every kind is eta m / (sqrt v + tau) = 0.1 x 0.05 / (sqrt(v) + 1e-3); the buffers
    take the average as it is (a running variance, a counter)."""
    opt = AdaptiveServer(kind, ETA, B1, B2, TAU)
    x = OrderedDict(w=torch.tensor([1.0]), var=torch.tensor([4.0]), count=torch.tensor(3))
    for d in (0.5, -0.2):
        avg = OrderedDict(w=x["w"] + d, var=torch.tensor([2.0]), count=torch.tensor(5))
        x = opt.step(x, avg, trainable=["w"])
        assert x["var"].item() == 2.0 and x["count"].item() == 5
    assert x["w"].item() == pytest.approx(_by_hand(kind, [0.5, -0.2]), rel=1e-6)
    if kind == "adam":  # sqrt(v1) = sqrt(0.99e-6 + 0.0025) = 0.050010: the first step 0.0980
        assert _by_hand(kind, [0.5]) == pytest.approx(1 + 0.1 * 0.05 / (math.sqrt(0.99e-6 + 0.0025) + 1e-3))


def test_the_server_algorithm_steps_with_it_and_keeps_its_moments():
    server = ServerAlgorithm(None, ServerArgs(server_optimizer="adam", server_lr=ETA), train_args())
    server.trainable = ["w"]
    x = OrderedDict(w=torch.tensor([1.0]))
    new = server.step(x, OrderedDict(w=torch.tensor([1.5])))
    assert new["w"].item() == pytest.approx(_by_hand("adam", [0.5]), rel=1e-6)
    again = ServerAlgorithm(None, ServerArgs(server_optimizer="adam", server_lr=ETA), train_args())
    again.trainable = ["w"]
    again.load_state(server.state())
    b = OrderedDict(w=new["w"] - 0.2)
    assert again.step(new, b)["w"].item() == server.step(new, b)["w"].item()


@pytest.mark.parametrize(
    ("config", "sets", "key"),
    [
        ("fedavg", ["server_args.server_optimizer=lamb"], "server_args.server_optimizer"),
        (
            "fedavg",
            ["server_args.server_optimizer=adam", "server_args.server_momentum=0.9"],
            "server_momentum",
        ),
        ("solo", ["server_args.server_optimizer=yogi"], "server_args.server_optimizer"),
        ("fedavg", ["server_args.server_tau=0"], "server_args.server_tau"),
        ("fedavg", ["server_args.server_beta1=1"], "server_args.server_beta1"),
        (
            "fedavg",
            [*BUFFERED, "server_args.buffered_rule=fedasync", "server_args.buffer_size=2"],
            "buffer_size",
        ),
        ("fedavg", [*BUFFERED, "server_args.fedasync_alpha=0"], "server_args.fedasync_alpha"),
        (
            "fedavg",
            [
                *BUFFERED,
                "server_args.buffered_rule=fedasync",
                "privacy_args.dp_noise_multiplier=0.1",
                "privacy_args.dp_clip_norm=1",
            ],
            "server_args.buffered_rule",
        ),
        (
            "fedavg",
            [*BUFFERED, "server_args.buffered_rule=fedasync", "privacy_args.secure_aggregation=true"],
            "server_args.buffered_rule",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(config, sets, key):
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIGS / f"{config}.yaml", sets)


@needs_fmnist
def test_fedasync_mixes_each_model_into_the_current_one(tmp_path, monkeypatch):
    """Two parties both training, party 0 taking 1 s and party 1 1.5 s, K = 1, alpha = 0.5:
    t = 1: A (party 0 from x0) gives x1 = x0 + 0.5 (a - x0); t = 1.5: B (party 1 from x0, one round
    stale, s = 1/sqrt 2) gives x2 = x1 + 0.5 s (b - x1): against the current model, not the one sent."""
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("0,1.0\n1,1.5\n")
    sets = [*BUFFERED, "train_args.client_num_in_total=2", "train_args.client_num_per_round=2"]
    sets += [
        "server_args.buffered_rule=fedasync",
        "server_args.fedasync_alpha=0.5",
        "train_args.party_speed=file",
    ]
    sets += [f"train_args.party_speed_file={speeds}"]
    spy: list = []
    final, records = run_standalone(tmp_path, "fedavg", sets, monkeypatch, spy)
    (_, x0, a), (_, _, b) = ((p, s["model"], u["model"]) for p, s, u in spy[:2])
    x1 = {k: x0[k].double() + 0.5 * (a[k].double() - x0[k].double()) for k in x0 if x0[k].is_floating_point()}
    x2 = {k: x1[k] + 0.5 / math.sqrt(2) * (b[k].double() - x1[k]) for k in x1}
    assert max_distance(x2, final) <= 1e-5
    assert [(r["parties"], r["staleness_max"]) for r in records] == [(1, 0), (1, 1)]


@pytest.mark.slow
@needs_fmnist
def test_fedasync_with_fedadam_in_the_mpi_simulation_is_the_standalone_run(tmp_path):
    """FedAsync (K = 1, alpha 0.6) with FedAdam's step, 4 parties at lognormal speeds, 3 training at
    once: the MPI simulation's server takes each update at its simulated instant and ends with the
    standalone run's model and records (the optimiser's moments and the mixing are the server's)."""
    sets = [
        *conformance.TINY,
        *BUFFERED,
        "server_args.buffered_rule=fedasync",
        "validation_args.local_test=false",
    ]
    sets += [
        "server_args.server_optimizer=adam",
        "server_args.server_lr=0.05",
        "train_args.party_speed=lognormal",
    ]
    sets += [
        "train_args.client_num_in_total=4",
        "train_args.client_num_per_round=3",
        "train_args.comm_round=4",
    ]
    config = CONFIGS / "moon.yaml"
    standalone_and_mpi(config, sets, tmp_path)
