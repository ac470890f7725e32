"""Config validation: each mistake gets one clear message naming the key and the fix."""

import pytest

from fedml_moon.config.load import ConfigError, config_from_dict, load_config, parse_overrides

FMNIST = "config/fashion_mnist/moon.yaml"


def test_shipped_configs_load(tmp_path):
    import glob

    # config/sweeps/ holds sweep files, not run configs: tests/test_sweep.py loads those.
    files = sorted(p for p in glob.glob("config/**/*.yaml", recursive=True) if "/sweeps/" not in p)
    assert len(files) >= 21
    for path in files:
        # config/site/ and networks/ read examples/site_data/write.py's folders (the how-tos write them)
        own = "/site/" in path or "/networks/" in path
        load_config(path, [f"data_args.data_cache_dir={tmp_path}"] if own else [])


@pytest.mark.parametrize(
    "override, key, hint",
    [
        (
            "train_args.algorithm=mooon",
            "train_args.algorithm",
            "unknown algorithm 'mooon'; choose one of fedavg, fedprox",
        ),
        ("data_args.partition_alpha=0", "data_args.partition_alpha", "must be > 0"),
        ("algorithm_args.temperature=0", "algorithm_args.temperature", "must be > 0"),
        ("algorithm_args.mu=-1", "algorithm_args.mu", "must be >= 0"),
        ("train_args.learnig_rate=0.1", "train_args.learnig_rate", "did you mean 'learning_rate'"),
        ("data_args.data_cache_dir=/no/such/dir", "data_args.data_cache_dir", "does not exist"),
        ("data_args.max_train_samples=50", "data_args.max_train_samples", "raise it to >= 100"),
        ("train_args.client_num_per_round=11", "train_args.client_num_per_round", "between 1 and"),
        ("train_args.epochs=two", "train_args.epochs", "must be an integer"),
        ("tracking_args.wandb_key=abc", "tracking_args.wandb_key", "WANDB_API_KEY"),
        ("comm_args.backend=GRPC", "comm_args.backend", "simulation runs over sp or MPI"),
        ("comm_args.backend=TCP", "comm_args.backend", "choose one of sp, MPI, GRPC, MQTT_S3"),
        ("common_args.training_type=cross_silo", "comm_args.backend", "cross_silo runs over MPI or GRPC"),
        ("comm_args.timeout_s=0", "comm_args.timeout_s", "must be > 0"),
        ("data_args.normalize_mean=[0.1]", "data_args.normalize_mean", "normalize_std together"),
        ("data_args.normalize_mean=[x]", "data_args.normalize_mean", "must be a list of numbers"),
        (
            "data_args.augmentation=autoaugment",
            "data_args.augmentation",
            "none, cifar10, cifar100, crop-flip",
        ),
        ("model_args.output_activation=relu", "model_args.output_activation", "none, softmax, log-softmax"),
        ("train_args.cuda_graphs=maybe", "train_args.cuda_graphs", "true, false or auto"),
        ("device_args.using_gpu=sometimes", "device_args.using_gpu", "true, false or auto"),
        ("comm_args.receive_window_kb=-1", "comm_args.receive_window_kb", "from 0"),
    ],
)
def test_config_errors_name_the_key_and_fix(override, key, hint):
    with pytest.raises(ConfigError) as err:
        load_config(FMNIST, [override])
    message = str(err.value)
    assert message.startswith(key) and hint in message


@pytest.mark.parametrize(
    "overrides, said",
    [
        ([], "the server tests the global model on the test set it holds"),
        (
            ["validation_args.evaluation=federated", "privacy_args.secure_aggregation=true"],
            "the server sees only the sites' test counts summed",
        ),
    ],
)
def test_a_site_mean_headline_needs_each_sites_own_figures(overrides, said):
    with pytest.raises(ConfigError) as err:
        load_config(FMNIST, ["validation_args.headline=site_mean", *overrides])
    assert str(err.value).startswith("validation_args.headline: site_mean needs") and said in str(err.value)
    assert "set headline: pooled" in str(err.value)
    with pytest.raises(ConfigError, match="validation_args.headline: 'mean' is not pooled"):
        load_config(FMNIST, ["validation_args.headline=mean"])
    federated = ["validation_args.evaluation=federated", "validation_args.headline=site_mean"]
    assert load_config(FMNIST, federated).validation_args.headline == "site_mean"


def test_unknown_section_is_suggested():
    with pytest.raises(ConfigError, match="did you mean 'train_args'"):
        config_from_dict({"trian_args": {}})


def test_fedml_passthrough_keys_are_accepted():
    cfg = config_from_dict({"comm_args": {"mqtt_config_path": "x.yaml"}, "device_args": {"worker_num": 3}})
    assert cfg.passthrough["comm_args"] == {"mqtt_config_path": "x.yaml"}
    assert cfg.passthrough["device_args"] == {"worker_num": 3}


def test_overrides_parse_yaml_values():
    assert parse_overrides(["a.b=3", "a.c=true", "d.e=null", "d.f=x"]) == {
        "a": {"b": 3, "c": True},
        "d": {"e": None, "f": "x"},
    }
    with pytest.raises(ConfigError, match="SECTION.KEY=VALUE"):
        parse_overrides(["comm_round=3"])


def test_a_number_written_1e_5_is_a_number_where_the_key_takes_one():
    """YAML 1.1 reads 1e-5 (no dot) as a string; a float key takes it as the number it says."""
    cfg = load_config(FMNIST, ["privacy_args.dp_delta=1e-6", "train_args.learning_rate=5E-3"])
    assert cfg.privacy_args.dp_delta == 1e-6 and cfg.train_args.learning_rate == 0.005
    with pytest.raises(ConfigError, match="train_args.learning_rate: must be a number; got 'e-3'"):
        load_config(FMNIST, ["train_args.learning_rate=e-3"])


def test_algorithm_options_are_typed_per_algorithm():
    cfg = load_config(FMNIST, ["algorithm_args.pool_size=3"])
    assert cfg.algorithm_args.pool_size == 3 and cfg.algorithm_args.mu == 1.0
    with pytest.raises(ConfigError, match="algorithm_args.pool_size: unknown key"):
        load_config("config/fashion_mnist/fedprox.yaml", ["algorithm_args.pool_size=3"])


def test_missing_config_file():
    with pytest.raises(ConfigError, match="no such config file"):
        load_config("config/nope.yaml")


def test_torch_threads_auto_is_half_the_usable_cores(monkeypatch):
    from fedml_moon.adapters import run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _: set(range(16)))
    assert run.torch_threads("auto") == 8
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _: {0, 1})
    assert run.torch_threads("auto") == 1  # this machine's size: one busy neighbour costs nothing
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _: {0})
    assert run.torch_threads("auto") == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run.torch_threads("auto") == 3 and run.torch_threads(2) == 2
    assert load_config(FMNIST).device_args.torch_threads == "auto"
    for bad in ("two", "0"):
        with pytest.raises(ConfigError, match="device_args.torch_threads: must be 'auto' or an integer >= 1"):
            load_config(FMNIST, [f"device_args.torch_threads={bad}"])


def test_report_best_is_standalone_only():
    with pytest.raises(
        ConfigError,
        match="algorithm_args.report_best: needs every party's model beside every party's test split",
    ):
        load_config("config/lg/mnist.yaml", ["comm_args.backend=MPI"])
