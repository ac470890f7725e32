"""From a config to partitioned, in-memory federated data (pure PyTorch / numpy, no FedML)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedml_moon.config.schema import ConfigError, DataArgs
from fedml_moon.core.partition import (
    PartitionError,
    class_matched_partition,
    dirichlet_partition,
    iid_partition,
    partition_counts,
    shard_partition,
)
from fedml_moon.core.parts import Parts
from fedml_moon.core.seeds import rng, seed_sequence
from fedml_moon.data.datasets import DataNotFoundError, load_dataset
from fedml_moon.data.formats import DataFileError
from fedml_moon.data.holdings import Holdings
from fedml_moon.data.partition_file import read_partition
from fedml_moon.data.plot import (
    HEATMAP_PARTIES,
    TABLE_PARTIES,
    format_partition_table,
    save_partition_heatmap,
    save_partition_summary,
    summarise_partition,
)

log = logging.getLogger(__name__)


@dataclass
class FederatedData:
    data: Holdings
    train_parts: Sequence[np.ndarray]  # `Parts` (one flat array) where the run partitioned the data
    test_parts: Sequence[np.ndarray]
    counts: np.ndarray  # [n_parties, num_classes] training samples per class
    party_ids: list[int] | None = None  # the parties of train_parts (default 0..n-1); a silo: its own

    @property
    def ids(self) -> list[int]:
        return list(range(len(self.train_parts))) if self.party_ids is None else list(self.party_ids)


def _subsample(
    x: torch.Tensor, y: torch.Tensor, limit: int | None, gen: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    if limit is None or limit >= len(y):
        return x, y
    keep = torch.from_numpy(np.sort(gen.permutation(len(y))[:limit]))
    return x[keep].contiguous(), y[keep].contiguous()


def _override_transforms(args: DataArgs, data: Holdings) -> None:
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


def _agrees(args: DataArgs, data: Holdings) -> None:
    """A public data set against what the config says of it (classes, image_size, channels), if it does."""
    c, h, _ = data.input_shape
    said = {
        "classes": (args.classes and len(args.classes), data.num_classes, "classes"),
        "image_size": (args.image_size, h, "pixels a side"),
        "channels": (args.channels, c, "channels"),
    }
    for key, (given, actual, what) in said.items():
        if given is not None and given != actual:
            raise ConfigError(
                f"data_args.{key}: {data.name} has {actual} {what}, the config says {given}; "
                f"set it to {actual} or leave it null"
            )


def load_data(args: DataArgs, seed: int) -> Holdings:
    """Load the data the config names (a public data set, optionally subsampled by max_train/test_samples,
    or a site's own data, checked against the agreement)."""
    key = "data_args.data_cache_dir" if args.data_cache_dir else "data_args.dataset"
    try:
        if args.site_format:
            from fedml_moon.data.site import load_site

            data = load_site(args, seed)
        else:
            data = load_dataset(args.dataset, args.data_cache_dir, download=args.download)
            _agrees(args, data)
            data.classes = tuple(args.classes or data.classes)
    except ConfigError:
        raise
    except (DataNotFoundError, DataFileError) as err:
        raise ConfigError(f"{key}: {err}") from None
    except ValueError as err:
        raise ConfigError(f"data_args.dataset: {err}") from None
    _override_transforms(args, data)
    train_rng, test_rng = rng(seed, "subsample_train"), rng(seed, "subsample_test")
    data.x_train, data.y_train = _subsample(data.x_train, data.y_train, args.max_train_samples, train_rng)
    data.x_test, data.y_test = _subsample(data.x_test, data.y_test, args.max_test_samples, test_rng)
    return data


def partition(args: DataArgs, data: Holdings, n_parties: int, seed: int) -> tuple[Sequence, Sequence]:
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
    if args.partition_method == "natural":
        return natural_partition(data, n_parties)
    if args.partition_method == "file":
        return read_partition(str(args.partition_path), data, n_parties)
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


def natural_partition(data: Holdings, n_parties: int) -> tuple[list, list]:
    """The data's own parties (one folder or party-column value each), as they are."""
    parties = data.parties
    if parties is None:
        raise ConfigError("data_args.partition_method: natural, but the data came without parties")
    if n_parties != len(parties.names):
        shown = ", ".join(parties.names[:6]) + (", ..." if len(parties.names) > 6 else "")
        raise ConfigError(
            f"train_args.client_num_in_total: {n_parties}, but the data hold {len(parties.names)} parties "
            f"({shown}); set client_num_in_total: {len(parties.names)} (client_num_per_round at most that)"
        )
    return list(parties.train), list(parties.test)


def prepare(args: DataArgs, n_parties: int, seed: int) -> FederatedData:
    """Load and partition (nothing is written: `show_partition` does that)."""
    data = load_data(args, seed)
    train_parts, test_parts = (Parts.of(parts) for parts in partition(args, data, n_parties, seed))
    counts = partition_counts(data.y_train.numpy(), train_parts, data.num_classes)
    return FederatedData(data, train_parts, test_parts, counts)


def prepare_own(args: DataArgs, seed: int, party: int | None, central: bool = False) -> FederatedData:
    """A process of a cross-silo run on the sites' own data (`config.own_data`): silo `party` its own
    party's data (`data.silo.load_own`), the server (`party` None) none, or with
    `validation_args.evaluation: central` its own test set (`args.data_cache_dir`, read whole)."""
    from fedml_moon.data.silo import agreement, load_own, server_test_set

    try:
        if party is None:
            data = server_test_set(args, seed) if central else agreement(args)
        else:
            data = load_own(args, seed, party)
    except DataFileError as err:
        raise ConfigError(f"data_args.data_cache_dir: {err}") from None
    _override_transforms(args, data)
    if party is None:
        empty = np.zeros((0, data.num_classes), dtype=np.int64)
        return FederatedData(data, [], [], empty, party_ids=[])
    train, test = [np.arange(len(data.y_train))], [np.arange(len(data.y_test))]
    counts = partition_counts(data.y_train.numpy(), train, data.num_classes)
    return FederatedData(data, train, test, counts, party_ids=[party])


def show_partition(fed: FederatedData, args: DataArgs, picture: Path | None = None) -> None:
    """The partition in the log (a table, or past `TABLE_PARTIES` parties a summary: the table is in
    partition.json) and, with `picture` (the run folder's partition.png), a picture there (a heat map,
    or past `HEATMAP_PARTIES` parties histograms of the parties' sizes and classes)."""
    many = len(fed.counts) > TABLE_PARTIES
    said = f" (summarised: {len(fed.counts)} parties; every party's counts are in partition.json)"
    log.info(
        "partition (%s), training samples per party and class%s:\n%s",
        args.partition_method,
        said if many else "",
        summarise_partition(fed.counts) if many else format_partition_table(fed.counts),
    )
    if fed.data.parties is not None and not many:
        log.info("parties (natural): %s", ", ".join(f"{i} {n}" for i, n in enumerate(fed.data.parties.names)))
    if picture is not None:
        n_parties = len(fed.train_parts)
        title = f"{fed.data.name}: {args.partition_method} partition over {n_parties} parties"
        if n_parties > HEATMAP_PARTIES:
            path = save_partition_summary(fed.counts, Path(picture), title)
            log.info("partition picture (histograms: %d parties): %s", n_parties, path)
            return
        named = tuple(str(i) for i in range(fed.data.num_classes)) != fed.data.classes
        parties = fed.data.parties.names if fed.data.parties is not None else ()
        classes = fed.data.classes if named else ()
        path = save_partition_heatmap(fed.counts, Path(picture), title, parties, classes)
        log.info("partition heat map: %s", path)
