"""Two rounds of a built-in algorithm driven through the pure core on a device (server half, party
half, loaders built for the device with the data set resident there), parties one after another or
together, and the distance between two such results; CUDA's synchronising calls in a round. Nothing
here imports FedML."""

from __future__ import annotations

import copy

import torch

from fedml_moon.algorithms.base import PartyRound
from fedml_moon.config.load import load_config
from fedml_moon.core.models import build_model
from fedml_moon.core.partition import dirichlet_partition
from fedml_moon.data.datasets import DatasetTensors
from fedml_moon.data.loader import build_fedml_dataset
from fedml_moon.engine.batched import PartyJob, train_parties, train_party
from fedml_moon.registry import get_algorithm
from tests.support.marks import cuda_only

BUILT_IN = ("fedavg", "fedprox", "fedssc", "lg", "moon", "scaffold", "solo")
CUDA = cuda_only
"""The mark of a test only a CUDA device runs (benchmarks/gpu_check.sh finds the files that use it)."""
PARTIES, SAMPLED = 5, (0, 1, 3, 4)
"""The parties of a round trip, and those sampled in each of its rounds."""


def party_data(augment: str = "none") -> DatasetTensors:
    """700 seeded random 28x28 grey images of 10 classes (the first 50 again as the test set)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (700, 1, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (700,), generator=g)
    return DatasetTensors("fashion-mnist", x, y, x[:50], y[:50], 10, (0.28,), (0.35,), augment)


def round_trip(
    algorithm: str,
    device: torch.device,
    parallel: bool,
    graphs: bool = False,
    augment: str = "none",
    sets: tuple[str, ...] = ("train_args.cuda_graphs=false",),
) -> tuple[dict, list[dict]]:
    """Two rounds (parties 0, 1, 3, 4 sampled; partial last batches); the final global model and every
    party's state. `graphs`: the batched steps of full batches go through the masked step; `sets`:
    more overrides (by default the eager step, on CUDA too)."""
    overrides = ["train_args.epochs=2", "train_args.batch_size=32", "train_args.learning_rate=0.05", *sets]
    if graphs:
        overrides += ["train_args.parties_in_parallel=4", "train_args.cuda_graphs=true"]
    cfg = load_config(f"config/fashion_mnist/{algorithm}.yaml", overrides)
    train, m, data = cfg.train_args, cfg.model_args, party_data(augment)
    parts = dirichlet_partition(data.y_train.numpy(), PARTIES, 0.5, seed=0)
    loaders = build_fedml_dataset(
        data, parts, None, 32, 0, False, device=device, resident=device.type == "cuda"
    )
    spec = get_algorithm(algorithm)

    def factory() -> torch.nn.Module:
        return build_model(m.model, (1, 28, 28), 10, m.use_projection_head, m.out_dim, m.output_activation)

    torch.manual_seed(0)
    model = factory().to(device)
    client = spec.client(cfg.algorithm_args, train, factory, 0)
    server = spec.server(cfg.algorithm_args, cfg.server_args, train, 0)
    global_state = server.setup(copy.deepcopy(model.state_dict()))
    states: list[dict] = [{} for _ in range(PARTIES)]
    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    for round_idx in range(2):
        rounds = [
            PartyRound(server.download(global_state, p), states[p], round_idx, p, names) for p in SAMPLED
        ]
        data = [loaders.train_data_local_dict[p] for p in SAMPLED]
        if parallel:
            jobs = [PartyJob(r, d) for r, d in zip(rounds, data, strict=True)]
            uploads = [u for _, u in train_parties(client, model, jobs, device)]
        else:
            uploads = [
                train_party(client, model, r.received, r.state, d, device, round_idx, r.party)[1]
                for r, d in zip(rounds, data, strict=True)
            ]
        weights = [float(len(parts[p])) for p in SAMPLED]
        global_state = server.aggregate(global_state, list(zip(weights, uploads, strict=True)))
    return global_state, states


def leaves(tree: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested structure of dicts, lists and tuples, by its path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in leaves(sub, f"{prefix}/{key}").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, sub in enumerate(tree) for k, v in leaves(sub, f"{prefix}/{i}").items()}
    return {}


def distances(a: tuple, b: tuple) -> dict[str, float]:
    """Max absolute difference per floating-point leaf of two (model, states) results."""
    one, two = leaves({"model": a[0], "states": a[1]}), leaves({"model": b[0], "states": b[1]})
    assert one.keys() == two.keys()
    return {
        key: float((t.double().cpu() - two[key].double().cpu()).abs().max())
        for key, t in one.items()
        if t.is_floating_point()
    }


def synchronising_calls(epochs: int, graphs: bool, together: str = "stacked") -> int:
    """CUDA's synchronising calls (sync debug mode "warn") in one MOON round of 4 resident parties."""
    import warnings

    from fedml_moon.algorithms.moon import MoonClient, MoonOptions
    from tests.support.tiny import train_args

    device, data = torch.device("cuda"), party_data("cifar10")
    parts = dirichlet_partition(data.y_train.numpy(), 4, 0.5, seed=0)
    loaders = build_fedml_dataset(data, parts, None, 32, 0, True, device=device, resident=True)

    def factory() -> torch.nn.Module:
        return build_model("simple-cnn", (1, 28, 28), 10, use_head=True, out_dim=16)

    train = train_args(
        epochs=epochs, batch_size=32, parties_in_parallel=4, cuda_graphs=graphs, together=together
    )
    algo = MoonClient(MoonOptions(mu=1.0), train, factory, 0)
    start = {k: v.to(device) for k, v in factory().state_dict().items()}
    names = tuple(n for n, p in factory().named_parameters() if p.requires_grad)
    jobs = [
        PartyJob(PartyRound({"model": start}, {}, 0, p, names), loaders.train_data_local_dict[p])
        for p in range(4)
    ]
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_parties(algo, factory().to(device), jobs, device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)
