"""Assemble a run from a Config: data, model, FedML init, trainer, aggregator, loop, records."""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedml_moon.adapters import compat
from fedml_moon.config.load import Config, config_to_dict, evaluation, own_data
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.models import build_model
from fedml_moon.core.parts import sizes_of
from fedml_moon.core.pretrained import load_pretrained
from fedml_moon.core.schedule import quorum
from fedml_moon.core.state import make_store
from fedml_moon.data.federated import FederatedData, prepare, prepare_own, show_partition
from fedml_moon.data.loader import FedMLDataset, build_fedml_dataset
from fedml_moon.data.partition_file import write_partition
from fedml_moon.data.precheck import server_hint
from fedml_moon.engine.claim_table import ClaimTable, Rows
from fedml_moon.engine.pace import Pace, resolve_pace
from fedml_moon.engine.precision import default_dtype
from fedml_moon.records.recorder import RunRecorder
from fedml_moon.records.tracking import TensorBoardRun, WandbRun
from fedml_moon.registry import get_algorithm
from fedml_moon.run_folder import RunFolder

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
    values["using_gpu"] = uses_gpu(cfg)  # FedML reads a plain flag
    values["output_dir"] = str(out_dir)
    # FedML's own runners would set up its MPI / cross-silo machinery for the other modes (asserting
    # process counts, building client id lists); the plugin's managers and transports replace it, so
    # every process describes itself to FedML as a single-process simulation. The mode stays in the Config.
    values["training_type"], values["backend"] = "simulation", "sp"
    return compat.minimal_fedml_args(**values)


def torch_threads(setting: int | str, local_procs: int = 1) -> int:
    """PyTorch's intra-op threads for `device_args.torch_threads`.

    "auto": OMP_NUM_THREADS when set, else half the cores this process may run on, shared among the
    `local_procs` processes of the run on this machine (MPI ranks), at least 1. OpenMP splits every
    operator over a fixed team and waits for its slowest thread: when another busy process shares
    one of the team's cores, each operator waits for that core's time slice. Half the cores leaves
    room for one such process; on 2 cores that is 1 thread (docs: how-to/speed.md).
    """
    if setting != "auto":
        return int(setting)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) >= 1:
        return int(os.environ["OMP_NUM_THREADS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // (2 * max(1, local_procs)))


def uses_gpu(cfg: Config) -> bool:
    """`device_args.using_gpu`, with `auto` (the default) true where a CUDA device is visible."""
    return bool(cfg.device_args.using_gpu) and torch.cuda.is_available()


def describe(device: torch.device, using_gpu: bool | str) -> str:
    """The device in words, and why (for the first log line of a run)."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)}; device_args.using_gpu: {using_gpu})"
    why = "no CUDA device is visible" if using_gpu is not False else "device_args.using_gpu: false"
    return f"{device} ({why})"


def select_device(cfg: Config, rank: int = 0) -> torch.device:
    """On GPUs (`using_gpu`): `adapters.gpus.select_gpu` (FedML's GPU mapping file, else the process's
    rank on its host, else `device_args.gpu_id` for a lone process); else the CPU."""
    if uses_gpu(cfg):
        from fedml_moon.adapters.gpus import select_gpu

        return torch.device(f"cuda:{select_gpu(cfg, rank, torch.cuda.device_count())}")
    if cfg.device_args.using_gpu is True:
        log.warning("device_args.using_gpu is true but no CUDA device is visible; running on the CPU")
    return torch.device("cpu")


def _wandb(cfg: Config, folder: RunFolder, config: dict) -> WandbRun | None:
    t = cfg.tracking_args
    if not t.enable_wandb or t.wandb_mode == "disabled":
        return None
    name = t.run_name or folder.root.name
    return WandbRun(t.wandb_project, t.wandb_entity, name, t.wandb_mode, folder.root, config)


def _tensorboard(cfg: Config, folder: RunFolder) -> TensorBoardRun | None:
    if not cfg.tracking_args.tensorboard:
        return None
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "tracking_args.tensorboard: true needs the tensorboard package, which is not installed; "
            "install it (pip install 'fedml-moon[tensorboard]'; bash run/setup.sh does) or set it false"
        )
    return TensorBoardRun(folder.root)


@dataclass
class Base:
    """What every process of a run builds the same way: data, partition, model, FedML's args; and
    the process's own folder of the run, where it writes."""

    cfg: Config
    args: Any
    device: torch.device
    fed: FederatedData
    dataset: FedMLDataset
    model: torch.nn.Module
    factory: Any
    spec: Any
    folder: RunFolder

    @property
    def seed(self) -> int:
        return self.cfg.common_args.random_seed


@dataclass
class Assembled(Base):
    """Everything a standalone run is made of, ready for `loop.run()` (or a benchmark's rounds)."""

    loop: Any = None


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


def initial_model(cfg: Config, factory: Any, input_shape: tuple[int, int, int]) -> torch.nn.Module:
    """The run's first model: `factory`'s (from the seed), then `model_args.pretrained`'s tensors
    where their names and shapes match (said in the log, with what was left as it was)."""
    m = cfg.model_args
    try:
        model = factory()
    except ConfigError:  # a model plugin's import, already naming its key
        raise
    except ValueError as err:  # e.g. the simple CNN on 64x64 images
        shape = "x".join(map(str, input_shape))
        said = f"(the data's inputs: {shape}, channels x height x width)"
        raise ConfigError(f"model_args.model: {err} {said}") from None
    if not m.pretrained:
        return model
    try:
        loaded = load_pretrained(model, m.pretrained)
    except ValueError as err:  # its message names model_args.pretrained and the file
        raise ConfigError(str(err)) from None
    log.info(
        "model_args.pretrained: %d of %d tensors loaded from %s (sha256 %s); left as initialised: %s%s%s",
        len(loaded.loaded),
        len(loaded.loaded) + len(loaded.missing),
        m.pretrained,
        loaded.sha256[:16],
        ", ".join(loaded.missing) or "none",
        f"; shapes differ, not loaded: {loaded.mismatched}" if loaded.mismatched else "",
        f"; the file's keys that match none: {', '.join(loaded.unused)}" if loaded.unused else "",
    )
    return model


def load_partition(cfg: Config, rank: int, role: str) -> FederatedData:
    """This process's data (see `build_base`)."""
    seed, n = cfg.common_args.random_seed, cfg.train_args.client_num_in_total
    if role == "all" or not own_data(cfg):
        try:
            return prepare(cfg.data_args, n, seed)
        except ConfigError as err:
            if role != "server":
                raise
            raise ConfigError(f"{err}{server_hint(cfg)}") from None
    if role == "server":
        fed = prepare_own(cfg.data_args, seed, None, central=evaluation(cfg) == "central")
        how = "on its own test set" if len(fed.data.y_test) else "none: each site tests on its own split"
        log.info("the server holds no training data; evaluation is %s (%s)", evaluation(cfg), how)
        return fed
    return prepare_own(cfg.data_args, seed, rank - 1)


def build_args(cfg: Config, out_dir: Path, rank: int = 0, local_procs: int = 1) -> Any:
    """PyTorch's threads and FedML's args for a process of this run (no data yet)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(torch_threads(cfg.device_args.torch_threads, local_procs))
    return fedml_args(cfg, out_dir)


def build_base(
    cfg: Config, out_dir: Path, rank: int = 0, local_procs: int = 1, args: Any = None, role: str = "all"
) -> Base:
    """Load and partition the data (before anything is written: data refused leave `out_dir` as it
    was), fill FedML's args (or, with `args` from `build_args`, bring those args up to `cfg`), build the
    initial model (from the seed).

    Every process of a run does this identically, so every process holds the same partition; but
    in cross-silo on the sites' own data (`config.own_data`) a silo (`role` "silo") reads its own
    party only and the server (`role` "server") none (`data.federated.prepare_own`)."""
    seed, train, folder = cfg.common_args.random_seed, cfg.train_args, RunFolder(out_dir)
    default_dtype(train.precision)  # fp64: the data and the model in float64
    device = select_device(cfg, rank)
    log.info("device: %s", describe(device, cfg.device_args.using_gpu))  # a run's first line
    fed = load_partition(cfg, rank, role)  # refused data write nothing
    if args is None:
        args = build_args(cfg, out_dir, rank, local_procs)
    else:
        vars(args).update(vars(fedml_args(cfg, out_dir)))
    np.random.seed(seed)  # with the two lines below, what fedml.init did here (the plugin no longer calls it)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    if fed.ids:  # a silo of a simulated partition holds the server's: drawn once, by the server
        drawn = cfg.tracking_args.plots and (role != "silo" or own_data(cfg))
        show_partition(fed, cfg.data_args, folder.partition_plot if drawn else None)
    if not cfg.tracking_args.plots:  # no earlier run's picture beside this run's records
        for path in (folder.partition_plot, folder.accuracy_plot):
            path.unlink(missing_ok=True)
    dataset = build_fedml_dataset(
        fed.data,
        fed.train_parts,
        fed.test_parts,
        train.batch_size,
        seed,
        train.drop_last,
        device=device,
        resident=device.type == "cuda",  # the data set lives on the GPU; batches never cross the bus
        party_ids=fed.ids,
    )
    if fed.ids:
        named = {"parties": list(fed.data.parties.names)} if fed.data.parties else {}
        ids = {"party_ids": fed.ids} if fed.party_ids is not None else {}
        write_partition(folder.root, fed.data, fed.train_parts, fed.test_parts, fed.counts, **named, **ids)
    factory = _model_factory(cfg, fed)
    torch.manual_seed(seed)
    model = initial_model(cfg, factory, fed.data.input_shape)
    return Base(cfg, args, device, fed, dataset, model, factory, get_algorithm(train.algorithm), folder)


def build_server(base: Base) -> Any:
    """The server's side: PluginServerAggregator, run records (and W&B), ServerRounds. Where it holds
    the partition (every mode but cross-silo on the sites' own data) it knows every party's claim."""
    from fedml_moon.adapters.aggregator import PluginServerAggregator
    from fedml_moon.engine.rounds import ServerRounds

    cfg, train = base.cfg, base.cfg.train_args
    server_algo = base.spec.server(cfg.algorithm_args, cfg.server_args, train, base.seed)
    aggregator = PluginServerAggregator(copy.deepcopy(base.model).to(base.device), base.args, server_algo)
    check_sum_form(cfg, server_algo, aggregator.global_state)
    claims = None
    if base.fed.ids:  # the server computed the partition: it knows what every party holds
        server_algo.class_counts = Rows(base.fed.ids, base.fed.counts)  # party -> its row, when asked
        claims = partition_claims(base)
    make_privacy = privacy_factory(base, aggregator) if cfg.privacy_args.on else None
    config, folder = config_to_dict(cfg), base.folder
    trackers = _wandb(cfg, folder, config), _tensorboard(cfg, folder)
    recorder = RunRecorder(folder.root, config, *trackers, cfg.tracking_args.plots)
    rounds = ServerRounds(
        aggregator,
        recorder,
        n_parties=train.client_num_in_total,
        per_round=train.client_num_per_round,
        rounds=train.comm_round,
        test_every=cfg.validation_args.frequency_of_the_test,
        seed=base.seed,
        test_global=base.dataset.test_data_global,
        device=base.device,
        args=base.args,
        party_eval=(cfg.validation_args.local_test or base.spec.client.personalized)
        and not cfg.privacy_args.secure_aggregation,
        eval_parties=cfg.validation_args.eval_parties,
        personalized=base.spec.client.personalized,
        on_bad_upload=train.on_bad_upload,
        save_party_models=train.save_party_models,
        claims=claims,
        make_privacy=make_privacy,
        terms=base.spec.client.terms,
        steps=(train.epochs, train.batch_size),
        federated=evaluation(cfg) == "federated",
        uniform=cfg.server_args.party_weights == "uniform",
    )
    rounds.num_classes = base.fed.data.num_classes
    rounds.secure = cfg.privacy_args.secure_aggregation
    rounds.headline = cfg.validation_args.headline
    return rounds


def privacy_factory(base: Base, aggregator: Any) -> Any:
    """privacy_args' accounting on the server, from the parties' weights (built when they are known:
    before any file is written where the server computed the partition)."""
    from fedml_moon.core.buffering import buffer_shape
    from fedml_moon.privacy.mod import PrivateAggregation
    from fedml_moon.privacy.scope import dp_scope

    cfg, train, server_algo = base.cfg, base.cfg.train_args, aggregator.algorithm

    buffered = cfg.server_args.aggregation == "buffered"
    per_round = buffer_shape(cfg)[1] if buffered else train.client_num_per_round  # a buffer is full

    def make(weights: dict[int, float]) -> PrivateAggregation:
        summed_weights = {p: server_algo.sum_weight(w) for p, w in weights.items()}
        if buffered and cfg.server_args.buffer_weights == "uniform":
            summed_weights = dict.fromkeys(weights, 1.0)
        fewest = per_round if buffered else quorum(cfg.comm_args.min_reports, per_round)
        metrics = ("loss", *base.spec.client.terms)
        privacy = PrivateAggregation(
            cfg.privacy_args, server_algo.summed, summed_weights, per_round, weights, fewest, metrics,
            buffered,
        )  # fmt: skip
        privacy.set_model(server_algo.trainable, aggregator.global_state)
        privacy.set_ledger(base.folder.privacy_ledger)
        privacy.scope = dp_scope(cfg, server_algo.summed, evaluation(cfg) == "federated")
        return privacy

    return make


def partition_claims(base: Base) -> ClaimTable:
    """Each party's claim under the run's partition (`held_claims`), where the server computed it: the
    only counts it takes from a silo. At most `comm_args.max_party_samples` samples each."""
    cap = base.cfg.comm_args.max_party_samples
    claims = held_claims(base)
    over = claims.samples > cap
    if over.any():
        raise ConfigError(
            f"comm_args.max_party_samples: parties {claims.parties[over][:10].tolist()} hold more than {cap} "
            f"samples ({claims.samples.max()}); raise the cap if this partition is intended"
        )
    return claims


def held_claims(base: Base) -> ClaimTable:
    """What each party this process holds would claim (`engine.claims`), from the index arrays,
    without making a party's loader: a `ClaimTable`, columns rather than a dict per party."""
    fed = base.fed
    samples = sizes_of(fed.train_parts)
    if fed.test_parts is None:  # every party is tested on the global test set
        tests = np.full(len(samples), int(base.dataset.test_data_num), dtype=np.int64)
    else:
        tests = sizes_of(fed.test_parts)
    return ClaimTable.of(fed.ids, samples, tests, fed.counts, class_threshold(base.cfg))


def class_threshold(cfg: Config) -> int | None:
    """min_class_samples of an algorithm that shares class prototypes (FedSSC), else None."""
    value = getattr(cfg.algorithm_args, "min_class_samples", None)
    return None if value is None else int(value)


def check_sum_form(cfg: Config, algorithm: Any, global_state: Any) -> None:
    """Under `privacy_args`, `train_args.stream_uploads` or buffered aggregation the server learns only
    sums: a config error, before the first round, when the algorithm's sum form would lose part of an upload
    (`engine.summed.sum_form_problem`)."""
    from fedml_moon.engine.summed import sum_form_problem

    p = cfg.privacy_args
    key = "train_args.stream_uploads" if cfg.train_args.stream_uploads else None
    if cfg.server_args.aggregation == "buffered":
        key = "server_args.aggregation"
    if p.on:
        key = "privacy_args.secure_aggregation" if p.secure_aggregation else "privacy_args.dp_clip_norm"
    if key is None:
        return
    name = cfg.train_args.algorithm
    problem = sum_form_problem(algorithm, algorithm.upload_spec(global_state, 0), name)
    if problem is not None:
        raise ConfigError(f"{key}: {problem}")


def build_runner(base: Base, store: Any = None) -> Any:
    """The parties' side: the algorithm's party half, the per-party store (`train_args.state_store`
    unless given), PluginClientTrainer."""
    from fedml_moon.adapters.trainer import PluginClientTrainer
    from fedml_moon.engine.parties import PartyRunner

    cfg, train = base.cfg, base.cfg.train_args
    client = base.spec.client(cfg.algorithm_args, train, base.factory, base.seed)
    store = store if store is not None else make_store(train.state_store, base.folder.party_state)
    trainer = PluginClientTrainer(copy.deepcopy(base.model).to(base.device), base.args, client, store)
    return PartyRunner(trainer, base.dataset, base.device, base.args, pace(base, trainer.model).parallel)


def pace(base: Base, model: torch.nn.Module) -> Pace:
    """How this process trains its parties (`engine.pace`): `train_args.parties_in_parallel`,
    `cuda_graphs` and `precision` resolved for its device; said in the log."""
    resolved = resolve_pace(base.cfg.train_args, base.device, model, tuple(base.fed.data.input_shape))
    log.info("%s", resolved.line())
    return resolved


def assemble(cfg: Config, out_dir: Path, resume: bool = False) -> Assembled:
    """A standalone run: both sides in this process, driven by StandaloneSimulation; with `resume`,
    from the newest checkpoint in `out_dir`."""
    from fedml_moon.engine.buffered import make_loop
    from fedml_moon.engine.resume import check_resumable

    if resume:  # no checkpoint, or another config: say so before anything is built or overwritten
        check_resumable(out_dir, cfg)
    base = build_base(cfg, out_dir)
    server, runner = build_server(base), build_runner(base)
    loop = make_loop(cfg, server, runner, resume)
    return Assembled(**vars(base), loop=loop)


def simulate(cfg: Config, out_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Run the standalone simulation through FedML's `FedMLRunner(..., algorithm_flow=...)`.

    Returns the summary (also written to out_dir/summary.json).
    """
    run = assemble(cfg, Path(out_dir), resume)
    compat.run_flow(run.loop, run.folder.fedml_home, run.args, run.device, run.dataset, run.model)
    return run.loop.summary
