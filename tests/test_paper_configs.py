"""Every shipped paper config carries the paper's hyper-parameters (MOON paper Sec. 4.1, FedSSC Sec. IV).

One table, read off the papers: a config that drifts from it (a wrong mu, a missing epoch) fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedml_moon.config.load import load_config

PAPER = Path(__file__).resolve().parent.parent / "config" / "paper"

# Common to every MOON-paper setting (Sec. 4.1): 10 parties, Dir(0.5), SGD lr 0.01, momentum 0.9,
# weight decay 1e-5, batch 64, E = 10 local epochs, the projection head with out_dim 256.
COMMON = {
    "parties": 10,
    "per_round": 10,
    "beta": 0.5,
    "lr": 0.01,
    "momentum": 0.9,
    "weight_decay": 1e-5,
    "batch": 64,
    "epochs": 10,
    "out_dim": 256,
}
DATASETS = {  # dataset -> (file prefix, encoder, rounds)
    "cifar10": ("cifar10", "simple-cnn", 100),
    "cifar100": ("cifar100", "resnet50", 100),
    "tiny-imagenet": ("tiny_imagenet", "resnet50", 20),
}
# algorithm -> {dataset: algorithm_args that must hold}; tau 0.5 wherever there is a contrastive loss
ALGORITHM_ARGS = {
    "moon": {
        "cifar10": {"mu": 5.0, "temperature": 0.5},
        "cifar100": {"mu": 1.0, "temperature": 0.5},
        "tiny-imagenet": {"mu": 1.0, "temperature": 0.5},
    },
    "fedprox": {"cifar10": {"mu": 0.01}, "cifar100": {"mu": 0.001}, "tiny-imagenet": {"mu": 0.001}},
    "fedavg": {"cifar10": {}, "cifar100": {}, "tiny-imagenet": {}},
    "scaffold": {"cifar10": {}, "cifar100": {}, "tiny-imagenet": {}},
    "solo": {"cifar10": {}, "cifar100": {}, "tiny-imagenet": {}},
    "fedssc": {  # FedSSC paper: mu_moon 5, mu_glob 1 -> 1e-4 after T0 = 5 of T = 100 rounds
        "cifar10": {
            "mu": 5.0,
            "temperature": 0.5,
            "mu_glob_start": 1.0,
            "mu_glob_end": 1e-4,
            "warmup_rounds": 5,
        }
    },
}
TABLE = [
    (f"{DATASETS[data][0]}_{algo}.yaml", algo, data, expected)
    for algo, per_data in ALGORITHM_ARGS.items()
    for data, expected in per_data.items()
]


def test_the_table_covers_every_paper_config():
    assert sorted(p.name for p in PAPER.glob("*.yaml")) == sorted(name for name, *_ in TABLE)


@pytest.mark.parametrize(("name", "algorithm", "dataset", "algo_args"), TABLE, ids=[t[0] for t in TABLE])
def test_paper_hyper_parameters(name: str, algorithm: str, dataset: str, algo_args: dict):
    cfg = load_config(PAPER / name)
    t, d, m = cfg.train_args, cfg.data_args, cfg.model_args
    _, encoder, rounds = DATASETS[dataset]
    if algorithm == "solo":  # "the number of local epochs is set to 300 for SOLO": one round of 300
        rounds, epochs = 1, 300
    else:
        epochs = COMMON["epochs"]
    assert (t.algorithm, d.dataset, m.model) == (algorithm, dataset, encoder)
    assert (t.comm_round, t.epochs) == (rounds, epochs)
    assert (t.client_num_in_total, t.client_num_per_round) == (COMMON["parties"], COMMON["per_round"])
    assert (d.partition_method, d.partition_alpha) == ("hetero", COMMON["beta"])
    assert (t.learning_rate, t.momentum, t.weight_decay) == (
        COMMON["lr"],
        COMMON["momentum"],
        COMMON["weight_decay"],
    )
    assert t.batch_size == COMMON["batch"] and t.drop_last  # the MOON repository drops the last batch
    assert m.use_projection_head and m.out_dim == COMMON["out_dim"]
    for key, value in algo_args.items():
        assert getattr(cfg.algorithm_args, key) == pytest.approx(value), f"{name}: algorithm_args.{key}"
