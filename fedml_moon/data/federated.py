"""From a config to partitioned, in-memory federated data (pure PyTorch / numpy, no FedML)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedml_moon.config_schema import ConfigError, DataArgs
from fedml_moon.core.partition import (
    PartitionError,
    class_matched_partition,
    dirichlet_partition,
    iid_partition,
    partition_counts,
    shard_partition,
)
from fedml_moon.core.seeds import rng, seed_sequence
from fedml_moon.data.datasets import DataNotFoundError, DatasetTensors, load_dataset
from fedml_moon.data.formats import DataFileError
from fedml_moon.data.plot import format_partition_table, save_partition_heatmap

log = logging.getLogger(__name__)


@dataclass
class FederatedData:
    data: DatasetTensors
    train_parts: list[np.ndarray]
    test_parts: list[np.ndarray]
    counts: np.ndarray  # [n_parties, num_classes] training samples per class


def _subsample(
    x: torch.Tensor, y: torch.Tensor, limit: int | None, gen: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    if limit is None or limit >= len(y):
        return x, y
    keep = torch.from_numpy(np.sort(gen.permutation(len(y))[:limit]))
    return x[keep].contiguous(), y[keep].contiguous()


def _override_transforms(args: DataArgs, data: DatasetTensors) -> None:
    """data_args.normalize_mean / normalize_std / augmentation in place of the dataset's defaults."""
    channels = data.input_shape[0]
    if args.normalize_mean is not None and args.normalize_std is not None:
        if len(args.normalize_mean) != channels:
            raise ConfigError(
                f"data_args.normalize_mean: {len(args.normalize_mean)} values for {channels}-channel "
                f"{data.name} images; give one mean and one std per channel"
            )
        data.mean, data.std = tuple(args.normalize_mean), tuple(args.normalize_std)
    if args.augmentation is not None:
        data.augment = args.augmentation


def load_data(args: DataArgs, seed: int) -> DatasetTensors:
    """Load the dataset named in the config, optionally subsampled (max_train/test_samples)."""
    key = "data_args.data_cache_dir" if args.data_cache_dir else "data_args.dataset"
    try:
        data = load_dataset(args.dataset, args.data_cache_dir, download=args.download)
    except (DataNotFoundError, DataFileError) as err:
        raise ConfigError(f"{key}: {err}") from None
    except ValueError as err:
        raise ConfigError(f"data_args.dataset: {err}") from None
    _override_transforms(args, data)
    train_rng, test_rng = rng(seed, "subsample_train"), rng(seed, "subsample_test")
    data.x_train, data.y_train = _subsample(data.x_train, data.y_train, args.max_train_samples, train_rng)
    data.x_test, data.y_test = _subsample(data.x_test, data.y_test, args.max_test_samples, test_rng)
    return data


def partition(args: DataArgs, data: DatasetTensors, n_parties: int, seed: int) -> tuple[list, list]:
    """Training and local-test index sets per party, as the config's partition_method says.

    The training partition draws on the seed's root stream (as published); the local test splits on
    their own independent stream.
    """
    y_train, y_test = data.y_train.numpy(), data.y_test.numpy()
    test_seed = seed_sequence(seed, "test_split")
    if n_parties > len(y_train):
        raise ConfigError(
            f"train_args.client_num_in_total: {n_parties} parties but only {len(y_train)} training samples; "
            "use fewer parties or more data"
        )
    try:
        if args.partition_method == "hetero":
            train = dirichlet_partition(
                y_train, n_parties, args.partition_alpha, seed, args.min_samples_per_client
            )
            return train, iid_partition(len(y_test), n_parties, test_seed)
        if args.partition_method == "homo":
            return iid_partition(len(y_train), n_parties, seed), iid_partition(
                len(y_test), n_parties, test_seed
            )
        train, party_classes = shard_partition(y_train, n_parties, args.shards_per_client, seed)
        return train, class_matched_partition(y_test, party_classes, test_seed)
    except PartitionError as err:
        raise ConfigError(
            f"train_args.client_num_in_total / data_args (partition_method {args.partition_method}): {err}; "
            "adjust train_args.client_num_in_total, data_args.partition_alpha, data_args.shards_per_client "
            "or data_args.min_samples_per_client"
        ) from None


def prepare(args: DataArgs, n_parties: int, seed: int, out_dir: Path | None = None) -> FederatedData:
    """Load, partition, and show the partition (a table in the log, a heat map PNG in out_dir)."""
    data = load_data(args, seed)
    train_parts, test_parts = partition(args, data, n_parties, seed)
    counts = partition_counts(data.y_train.numpy(), train_parts, data.num_classes)
    log.info(
        "partition (%s), training samples per party and class:\n%s",
        args.partition_method,
        format_partition_table(counts),
    )
    if out_dir is not None:
        title = f"{data.name}: {args.partition_method} partition over {n_parties} parties"
        path = save_partition_heatmap(counts, Path(out_dir) / "partition.png", title)
        log.info("partition heat map: %s", path)
    return FederatedData(data, train_parts, test_parts, counts)
