"""What each process of a cross-silo run on the sites' own data reads (`config.own_data`).

A silo reads its own party only: its `data_cache_dir` is its data set (``<class>/``, or ``train/`` and
``test/``; a table or Hugging Face dataset without `party_column`; a plugin's ``(train, test)``), or,
for trials on one machine, a per-party folder (``<party>/...``, a party column, a plugin's
``{party: (train, test)}``) from which it takes the party at its own index (silo rank r holds party
r - 1, the parties in sorted order, as a standalone run's natural partition numbers them).

The server reads nothing: the agreement (`data_args.classes`, `image_size`, `channels`) gives the
model its input shape and classes (`agreement`). Only with `validation_args.evaluation: central` does
it read a test set of its own, its `data_cache_dir` whole (`server_test_set`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from fedml_moon.config.schema import ConfigError, DataArgs
from fedml_moon.data import tables
from fedml_moon.data.holdings import Holdings
from fedml_moon.data.owned import Owned, owners
from fedml_moon.data.site import TEST_FOLDERS, assemble, image_folder, plugin, plugin_function

log = logging.getLogger(__name__)
SPLITS = {"train", *TEST_FOLDERS}


def single_site(root: Path, classes: list[str]) -> bool:
    """Whether an image folder is one site's (its folders are classes, or train/ and test/ or val/)
    rather than one folder per party."""
    names = {d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")}
    return bool(names) and names <= set(classes) | SPLITS


def _read(args: DataArgs, root: Path, party: int) -> Owned:
    """The silo's own data: its whole folder (named ""), or party `party`'s of a per-party one."""
    if args.dataset == "imagefolder":
        if single_site(root, args.classes):
            return image_folder(args, root, {"": root})
        found = owners(root, True)
        return image_folder(args, root, _pick(found, party, root))
    if args.dataset == "plugin":
        owned = plugin(args, plugin_function(args.plugin), either=True)
    else:
        split = "natural" if _has_party_column(args, root) else "homo"
        flat = dataclasses.replace(args, partition_method=split)
        owned = tables.table(flat, root) if args.dataset == "table" else tables.hf(flat, root)
    return owned if "" in owned else _pick(owned, party, root)


def _has_party_column(args: DataArgs, root: Path) -> bool:
    """Whether a table's or Hugging Face dataset's training split has `party_column` (a per-party
    table) or not (the site's own table: every row is its party's)."""
    if args.dataset == "table":
        train = tables.find_table(root, "train")
        return train is not None and args.party_column in tables.read_frame(train).columns
    ds, _ = tables.hf_splits(root)["train"]
    return args.party_column in ds.column_names


def _pick(found: dict, party: int, root: Path) -> dict:
    """The entry of `found` (party name -> data, sorted) at index `party`."""
    names = sorted(found)
    if party >= len(names):
        raise ConfigError(
            f"data_args.data_cache_dir: {root} holds {len(names)} parties ({', '.join(names[:6])}), and this "
            f"silo is party {party} (rank {party + 1}); give it its own data (or a folder with that party)"
        )
    return {names[party]: found[names[party]]}


def load_own(args: DataArgs, seed: int, party: int) -> Holdings:
    """Silo `party`'s own data as a one-party natural partition (its seeded test share, when it has
    no test split, drawn as party `party`'s of a standalone run)."""
    if not args.data_cache_dir and args.dataset != "plugin":
        raise ConfigError(
            f"data_args.data_cache_dir: dataset {args.dataset} reads this silo's own files; name their folder"
        )
    root = Path(args.data_cache_dir).expanduser() if args.data_cache_dir else Path.cwd()
    ((name, pair),) = _read(args, root, party).items()
    name = name or root.name or f"party {party}"
    holdings = assemble(args, {name: pair}, seed, first=party)
    log.info(
        "party %d (%s): %d train / %d test samples of shape %s from %s",
        party, name, len(holdings.y_train), len(holdings.y_test), holdings.input_shape, root,
    )  # fmt: skip
    return holdings


def agreement(args: DataArgs) -> Holdings:
    """No sample at all, of the shape and classes the run agrees on: what a server without data holds."""
    shape = (args.channels, args.image_size, args.image_size)
    kind = torch.float32 if args.dataset == "table" else torch.uint8
    x = torch.zeros((0, *shape), dtype=kind if kind == torch.uint8 else torch.get_default_dtype())
    y = torch.zeros(0, dtype=torch.int64)
    c = args.channels
    return Holdings(
        args.dataset, x, y, x.clone(), y.clone(), len(args.classes),
        (0.0,) * c, (1.0,) * c, "none", tuple(args.classes),
    )  # fmt: skip


def server_test_set(args: DataArgs, seed: int) -> Holdings:
    """`validation_args.evaluation: central` on a server of the sites' own data: its `data_cache_dir`
    read as one site's (its train and test splits together) is its test set."""
    if not args.data_cache_dir and args.dataset != "plugin":
        raise ConfigError(
            "validation_args.evaluation: central needs a test set on the server: name its folder in "
            "data_args.data_cache_dir (or use evaluation: federated, where the sites test)"
        )
    root = Path(args.data_cache_dir).expanduser() if args.data_cache_dir else Path.cwd()
    flat = dataclasses.replace(args, partition_method="homo")
    if args.dataset == "imagefolder":
        owned = image_folder(flat, root, {"": root})
    elif args.dataset == "plugin":
        owned = plugin(flat, plugin_function(args.plugin))
    else:
        owned = tables.table(flat, root) if args.dataset == "table" else tables.hf(flat, root)
    (x, y), test = owned[""]
    if test is not None:
        x, y = torch.cat([x, test[0]]), np.concatenate([y, test[1]])
    out = agreement(args)
    out.x_test, out.y_test = x, torch.from_numpy(y)
    out.x_train = x[:0]
    log.info("the server's own test set: %d samples from %s", len(y), root)
    return out
