"""Assemble a run from a Config: data, model, FedML init, trainer, aggregator, loop, records."""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedml_moon.config import Config, config_to_dict
from fedml_moon.core.models import build_model
from fedml_moon.core.state import make_store
from fedml_moon.data.federated import FederatedData, prepare
from fedml_moon.data.loader import build_fedml_dataset
from fedml_moon.glue import compat
from fedml_moon.metrics import RunRecorder
from fedml_moon.registry import get_algorithm
from fedml_moon.tracking import WandbRun

log = logging.getLogger(__name__)


def fedml_args(cfg: Config, out_dir: Path) -> Any:
    """FedML's argument namespace, filled from the validated Config (the only place that does so)."""
    values: dict[str, Any] = {}
    for section in (
        "common_args",
        "data_args",
        "model_args",
        "train_args",
        "validation_args",
        "device_args",
        "comm_args",
        "tracking_args",
    ):
        values.update(vars(getattr(cfg, section)))
        values.update(cfg.passthrough.get(section, {}))
    values["enable_wandb"] = False  # the plugin owns W&B logging (FedML's copies every argument)
    values["output_dir"] = str(out_dir)
    return compat.minimal_fedml_args(**values)


def torch_threads(setting: int | str) -> int:
    """PyTorch's intra-op threads for `device_args.torch_threads`.

    "auto": OMP_NUM_THREADS when set, else half the cores this process may run on (at least 1).
    OpenMP splits every operator over a fixed team and waits for its slowest thread: when another
    busy process shares one of the team's cores, each operator waits for that core's time slice.
    Half the cores leaves room for one such process; on 2 cores that is 1 thread (README, Speed).
    """
    if setting != "auto":
        return int(setting)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) >= 1:
        return int(os.environ["OMP_NUM_THREADS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


def select_device(cfg: Config) -> torch.device:
    if cfg.device_args.using_gpu and torch.cuda.is_available():
        return torch.device(f"cuda:{cfg.device_args.gpu_id}")
    if cfg.device_args.using_gpu:
        log.warning("device_args.using_gpu is true but no CUDA device is visible; running on the CPU")
    return torch.device("cpu")


def _wandb(cfg: Config, out_dir: Path, config: dict) -> WandbRun | None:
    t = cfg.tracking_args
    if not t.enable_wandb or t.wandb_mode == "disabled":
        return None
    name = t.run_name or out_dir.name
    return WandbRun(t.wandb_project, t.wandb_entity, name, t.wandb_mode, out_dir, config)


@dataclass
class Assembled:
    """Everything a run is made of, ready for `loop.run()` (or a benchmark's single rounds)."""

    cfg: Config
    args: Any
    device: torch.device
    fed: FederatedData
    dataset: list
    model: torch.nn.Module
    loop: Any


def _model_factory(cfg: Config, fed: FederatedData):
    m = cfg.model_args

    def factory() -> torch.nn.Module:
        return build_model(
            m.model,
            fed.data.input_shape,
            fed.data.num_classes,
            m.use_projection_head,
            m.out_dim,
            m.output_activation,
        )

    return factory


def assemble(cfg: Config, out_dir: Path) -> Assembled:
    """Load and partition data, build the model, initialise FedML, wire trainer, aggregator and loop."""
    from fedml_moon.glue.aggregator import PluginServerAggregator
    from fedml_moon.glue.rounds import ServerRounds
    from fedml_moon.glue.simulation import StandaloneSimulation
    from fedml_moon.glue.trainer import PartyRunner, PluginClientTrainer

    out_dir.mkdir(parents=True, exist_ok=True)
    seed, train = cfg.common_args.random_seed, cfg.train_args
    torch.set_num_threads(torch_threads(cfg.device_args.torch_threads))
    np.random.seed(seed)
    device = select_device(cfg)
    fed = prepare(cfg.data_args, train.client_num_in_total, seed, out_dir)
    dataset = build_fedml_dataset(
        fed.data, fed.train_parts, fed.test_parts, train.batch_size, seed, train.drop_last, device=device
    )
    (out_dir / "partition.json").write_text(json.dumps({"counts": fed.counts.tolist()}))
    factory = _model_factory(cfg, fed)
    torch.manual_seed(seed)
    model = factory()
    args = compat.init_fedml(fedml_args(cfg, out_dir), out_dir / ".fedml")
    spec = get_algorithm(train.algorithm)
    client = spec.client(cfg.algorithm_args, train, factory, seed)
    store = make_store(train.state_store, out_dir / "party_state")
    trainer = PluginClientTrainer(copy.deepcopy(model).to(device), args, client, store)
    aggregator = PluginServerAggregator(
        model.to(device), args, spec.server(cfg.algorithm_args, cfg.server_args, train, seed)
    )
    config = config_to_dict(cfg)
    recorder = RunRecorder(out_dir, config, _wandb(cfg, out_dir, config))
    server = ServerRounds(
        aggregator,
        recorder,
        n_parties=train.client_num_in_total,
        per_round=train.client_num_per_round,
        rounds=train.comm_round,
        test_every=cfg.validation_args.frequency_of_the_test,
        seed=seed,
        test_global=dataset[3],
        device=device,
        args=args,
        party_eval=cfg.validation_args.local_test or spec.client.personalized,
        personalized=spec.client.personalized,
        new_test_method=getattr(cfg.algorithm_args, "new_test_method", "average"),
    )
    loop = StandaloneSimulation(server, PartyRunner(trainer, dataset, device, args))
    return Assembled(cfg, args, device, fed, dataset, model, loop)


def simulate(cfg: Config, out_dir: Path) -> dict[str, Any]:
    """Run the standalone simulation through FedML's `FedMLRunner(..., algorithm_flow=...)`.

    Returns the summary (also written to out_dir/summary.json).
    """
    import fedml

    run = assemble(cfg, Path(out_dir))
    fedml.FedMLRunner(run.args, run.device, run.dataset, run.model, algorithm_flow=run.loop).run()
    return run.loop.summary
