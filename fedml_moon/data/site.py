"""A site's own data (`data_args.dataset`: imagefolder, table, hf, plugin) read into `Holdings` and
checked against the run's agreement (`data_args.classes`, `image_size`, `channels`) before anything
trains. With `partition_method: natural` the data come split by their owners (a folder, or a party
column's value, per party) and those are the parties."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedml_moon.config.schema import ConfigError, DataArgs
from fedml_moon.core.seeds import rng
from fedml_moon.data import tables
from fedml_moon.data.holdings import Holdings, Parties
from fedml_moon.data.images import cached_decode, convert, list_images
from fedml_moon.data.owned import Owned, Split, labels_to_indices, owners

log = logging.getLogger(__name__)
TEST_FOLDERS = ("test", "val")  # an image folder's test split, the first of these that is there


def image_folder(args: DataArgs, root: Path, folders: dict[str, Path] | None = None) -> Owned:
    """torchvision's ImageFolder layout: ``F/train/<class>/`` and ``F/test/<class>/`` (or ``F/val/``),
    or ``F/<class>/`` (a seeded test share) for F the site's folder, or each party's with a natural
    partition (`folders`: party -> F, default `owners`)."""
    listed: list[tuple[str, str, list]] = []  # (party, split, [(path, label)])
    folders = folders if folders is not None else owners(root, args.partition_method == "natural")
    for party, folder in folders.items():
        test = next((folder / s for s in TEST_FOLDERS if (folder / s).is_dir()), None)
        if (folder / "train").is_dir():
            listed.append((party, "train", list_images(folder / "train", args.classes)))
            if test is not None:
                listed.append((party, "test", list_images(test, args.classes)))
        elif test is not None:
            raise ConfigError(
                f"data_args.data_cache_dir: {folder} has {test.name}/ but no train/; put the training "
                f"images in {folder / 'train'}/<class>/ (or leave {test.name}/ out: <class>/ folders alone)"
            )
        else:
            listed.append((party, "train", list_images(folder, args.classes)))
    paths = [Path(p) for _, _, items in listed for p, _ in items]
    x = torch.from_numpy(cached_decode(root, paths, args.channels, args.image_size))
    out: Owned = {}
    start = 0
    for party, split, items in listed:
        part = (x[start : start + len(items)], np.array([c for _, c in items], dtype=np.int64))
        start += len(items)
        train, test = out.get(party, (None, None))
        out[party] = (part, None) if split == "train" else (train, part)
    return out


def _as_sample(x: Any, args: DataArgs, where: str) -> torch.Tensor:
    """A plugin's input: a PIL image (decoded as the image folders are) or a [C, H, W] tensor / array."""
    from PIL import Image

    if isinstance(x, Image.Image):
        pixels = convert(x, args.channels, args.image_size, Path(where))[0]
        return torch.from_numpy(pixels.copy())  # PIL's array is read-only
    t = torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x
    if t.dtype != torch.uint8 and not t.is_floating_point():
        raise ConfigError(
            f"data_args.plugin: {where} is a {t.dtype} tensor; give uint8 pixels (scaled by 1/255) or "
            "floating-point values (used as they are)"
        )
    shape = (args.channels, args.image_size, args.image_size)
    if tuple(t.shape) != shape:
        raise ConfigError(
            f"data_args.channels / image_size: {where} has shape {tuple(t.shape)}, the run agrees on "
            f"{shape} ([channels, image_size, image_size]); make the plugin return that shape"
        )
    return t


def _dataset_split(dataset: Any, args: DataArgs, where: str) -> Split:
    """Every (x, y) of a torch Dataset, in memory: x stacked (uint8, or float), y as class indices."""
    xs, ys = [], []
    for i in range(len(dataset)):
        x, y = dataset[i]
        xs.append(_as_sample(x, args, f"{where}[{i}]"))
        ys.append(int(y) if isinstance(y, (torch.Tensor, np.integer)) else y)
    if not xs:
        raise ConfigError(f"data_args.plugin: {where} is empty; a site needs samples to train on")
    uint8 = all(x.dtype == torch.uint8 for x in xs)
    x = (
        torch.stack(xs)
        if uint8
        else torch.stack([x.float() / 255 if x.dtype == torch.uint8 else x for x in xs])
    )
    return x if uint8 else x.to(torch.get_default_dtype()), labels_to_indices(ys, args.classes, where, True)


def plugin(args: DataArgs, load: Callable[[DataArgs], Any], either: bool = False) -> Owned:
    """`data_args.plugin`: its function returns (train, test) torch Datasets (test may be None), or,
    for a natural partition, {party: (train, test)} (`either`: whichever it returns)."""
    try:
        got = load(args)
    except Exception as err:
        log.debug("data_args.plugin %s failed", args.plugin, exc_info=True)
        raise ConfigError(f"data_args.plugin: {args.plugin} raised {err!r} (-v shows where)") from None
    natural = isinstance(got, Mapping) if either else args.partition_method == "natural"
    if natural != isinstance(got, Mapping):
        want = "{party name: (train, test)}" if natural else "(train, test)"
        raise ConfigError(f"data_args.plugin: {args.plugin} returned a {type(got).__name__}; give {want}")
    pairs = dict(sorted(got.items(), key=lambda kv: str(kv[0]))) if natural else {"": got}
    out: Owned = {}
    for party, pair in pairs.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ConfigError(
                f"data_args.plugin: {args.plugin} must give (train, test) Datasets; got {pair!r:.80}"
            )
        name = f"{args.plugin}{f' party {party}' if party else ''}"
        train = _dataset_split(pair[0], args, f"{name} train")
        out[str(party)] = (train, None if pair[1] is None else _dataset_split(pair[1], args, f"{name} test"))
    return out


def _split_off(split: Split, fraction: float, gen: np.random.Generator) -> tuple[Split, Split]:
    x, y = split
    order = gen.permutation(len(y))
    n_test = int(round(len(y) * fraction))
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    return (x[train], y[train]), (x[test], y[test])


def assemble(args: DataArgs, owned: Owned, seed: int, first: int = 0) -> Holdings:
    """The parties' splits (a seeded test share where a party has none: party i's drawn on its own
    stream, i counted from `first`) as one `Holdings`; with a natural partition its `parties` index
    each party's samples, and the test set is their union."""
    trains, tests = [], []
    for i, (party, (train, test)) in enumerate(owned.items(), start=first):
        if test is None:
            train, test = _split_off(train, args.test_fraction, rng(seed, "site_test_split", i))
        who = f"party {party!r}" if party else "the site"
        if len(train[1]) == 0:
            raise ConfigError(f"data_args.data_cache_dir: {who} holds no training samples; give it some")
        if len(test[1]) == 0 and args.partition_method == "natural":
            raise ConfigError(
                f"data_args.data_cache_dir: {who} holds no test samples; give it a test split, or more "
                "samples for the seeded test share (data_args.test_fraction)"
            )
        trains.append(train)
        tests.append(test)
    if sum(len(t[1]) for t in tests) == 0:
        raise ConfigError(
            "data_args.data_cache_dir: no test samples; fill the test split, or leave it out for a seeded "
            "share of data_args.test_fraction"
        )
    kinds = {t[0].dtype for t in trains + tests}
    if len(kinds) > 1:
        raise ConfigError(
            f"data_args.plugin: the parties' samples mix {sorted(map(str, kinds))}; give one kind"
        )
    x_train, x_test = torch.cat([t[0] for t in trains]), torch.cat([t[0] for t in tests])
    y_train = torch.from_numpy(np.concatenate([t[1] for t in trains]))
    y_test = torch.from_numpy(np.concatenate([t[1] for t in tests]))
    parties = None
    if args.partition_method == "natural":
        parties = Parties(
            tuple(owned), _ranges([len(t[1]) for t in trains]), _ranges([len(t[1]) for t in tests])
        )
    c = int(x_train.shape[1])
    return Holdings(
        args.dataset, x_train, y_train, x_test, y_test, len(args.classes),
        (0.0,) * c, (1.0,) * c, "none", tuple(args.classes), parties,
    )  # fmt: skip


def _ranges(sizes: list[int]) -> list[np.ndarray]:
    ends = np.cumsum([0, *sizes])
    return [np.arange(ends[i], ends[i + 1], dtype=np.int64) for i in range(len(sizes))]


def load_site(args: DataArgs, seed: int) -> Holdings:
    """Read the site's data as `data_args` says, checked against the agreement."""
    if not args.data_cache_dir and args.dataset != "plugin":
        raise ConfigError(
            f"data_args.data_cache_dir: dataset {args.dataset} reads the site's own files; name their folder"
        )
    root = Path(args.data_cache_dir).expanduser() if args.data_cache_dir else Path.cwd()
    if args.dataset == "imagefolder":
        owned = image_folder(args, root)
    elif args.dataset == "plugin":
        owned = plugin(args, plugin_function(args.plugin))
    else:
        owned = tables.table(args, root) if args.dataset == "table" else tables.hf(args, root)
    holdings = assemble(args, owned, seed)
    log.info(
        "%s in %s: %d train / %d test samples of shape %s, %d classes%s",
        args.dataset, root, len(holdings.y_train), len(holdings.y_test), holdings.input_shape,
        holdings.num_classes, f", {len(owned)} parties" if holdings.parties else "",
    )  # fmt: skip
    return holdings


def plugin_function(ref: str) -> Callable:
    """`module:function` (the module on the Python path or in the current directory) or
    `path/to/file.py:function` (from the current directory): the dataset plugin's function."""
    from fedml_moon.plugins import import_attribute

    return import_attribute(ref, "data_args.plugin", (Path.cwd(),))
