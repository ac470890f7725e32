"""The run's config travels from the server to its silos: a silo keeps its own local settings, takes
every shared one from the server, is refused only for shared settings it set itself; the round's quorum
by default is half of the sampled parties."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.distributed.deploy import explicit_keys, shared_config, with_shared
from fedml_moon.distributed.managers import config_differences, config_digest, quorum

ROOT = Path(__file__).resolve().parent.parent
GRPC = ROOT / "config" / "modes" / "moon_cross_silo_grpc.yaml"


@pytest.mark.parametrize(("server_plots", "silo_plots"), [(False, True), (True, False)])
def test_whether_a_site_draws_its_pictures_is_its_own_setting(server_plots, silo_plots):
    """tracking_args.plots is each process's own: the server's value is not in what it shares, and a
    silo that takes the server's settings keeps its own either way."""
    server = load_config(GRPC, [f"tracking_args.plots={server_plots}"])
    silo = load_config(GRPC, [f"tracking_args.plots={silo_plots}"])
    shared = shared_config(server)
    assert not [key for key in shared if key.startswith("tracking_args")]
    assert with_shared(silo, shared).tracking_args.plots is silo_plots


def test_a_silo_takes_the_servers_shared_settings_and_keeps_its_own_local_ones(tmp_path):
    server = load_config(ROOT / "config" / "fashion_mnist" / "fedprox.yaml", ["train_args.learning_rate=0.3"])
    silo = load_config(
        GRPC,
        [
            f"data_args.data_cache_dir={tmp_path}",
            "train_args.state_store=disk",
            "comm_args.timeout_s=7",
            "device_args.torch_threads=1",
        ],
    )
    run = with_shared(silo, shared_config(server))
    assert shared_config(run) == shared_config(server)
    assert config_digest(shared_config(run)) == config_digest(shared_config(server))
    assert run.train_args.algorithm == "fedprox" and run.algorithm_args.mu == 0.01  # not MOON's options
    assert run.train_args.learning_rate == 0.3 and run.model_args.model == server.model_args.model
    # its own: where its data is, its state store, how it talks, its threads
    assert run.data_args.data_cache_dir == str(tmp_path) and run.train_args.state_store == "disk"
    assert run.comm_args.backend == "GRPC" and run.comm_args.timeout_s == 7
    assert run.device_args.torch_threads == 1


def test_only_shared_settings_given_with_set_must_agree_with_the_server():
    cfg = load_config(GRPC)
    given = ["train_args.learning_rate=0.2", "comm_args.timeout_s=4", "data_args.data_cache_dir=/x"]
    assert explicit_keys(given, cfg) == ["train_args.learning_rate"]
    assert explicit_keys([], cfg) == []


def test_the_digest_names_the_settings_exactly():
    a = shared_config(load_config(GRPC))
    b = shared_config(load_config(GRPC, ["train_args.learning_rate=0.02"]))
    assert config_digest(a) == config_digest(dict(reversed(list(a.items()))))  # key order does not count
    assert config_digest(a) != config_digest(b)
    assert config_differences(a, b) == ["train_args.learning_rate"]


@pytest.mark.parametrize(
    ("setting", "sampled", "need"),
    [("half", 10, 5), ("half", 3, 2), ("half", 2, 1), ("half", 1, 1), ("all", 10, 10), (3, 10, 3), (4, 2, 2)],
)
def test_quorum(setting, sampled, need):
    assert quorum(setting, sampled) == need


def test_min_reports_is_half_by_default_and_null_still_means_every_party():
    assert load_config(GRPC).comm_args.min_reports == "half"
    assert load_config(GRPC, ["comm_args.min_reports=null"]).comm_args.min_reports == "all"
    assert load_config(GRPC, ["comm_args.min_reports=3"]).comm_args.min_reports == 3
    with pytest.raises(ConfigError, match="comm_args.min_reports"):
        load_config(GRPC, ["comm_args.min_reports=most"])
    with pytest.raises(ConfigError, match="more than the 10 parties sampled"):
        load_config(GRPC, ["comm_args.min_reports=11"])
