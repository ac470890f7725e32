"""Tables (CSV / Parquet through pandas and pyarrow) and Hugging Face `datasets` (saved to disk, or
their parquet files): a site's own data as `data.site` splits, checked against the agreement."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedml_moon.config.schema import ConfigError, DataArgs
from fedml_moon.data.formats import DataFileError
from fedml_moon.data.images import decode_all
from fedml_moon.data.owned import Owned, Split, labels_to_indices

log = logging.getLogger(__name__)

READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    ".csv": pd.read_csv,
    ".parquet": pd.read_parquet,
    ".pq": pd.read_parquet,
}
HF_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")  # what save_to_disk writes


def find_table(root: Path, split: str) -> Path | None:
    """``root/<split>.csv`` (or .parquet, .pq); two of them is ambiguous and refused."""
    found = [root / f"{split}{suffix}" for suffix in READERS if (root / f"{split}{suffix}").is_file()]
    if len(found) > 1:
        raise ConfigError(
            f"data_args.data_cache_dir: {root} holds {', '.join(p.name for p in found)}; keep one"
        )
    return found[0] if found else None


def read_frame(path: Path) -> pd.DataFrame:
    """A CSV or Parquet file as a DataFrame; DataFileError, naming it, when it cannot be read."""
    try:
        return READERS[path.suffix](path)
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        kind = "CSV" if path.suffix == ".csv" else "Parquet"
        raise DataFileError(
            path, f"not a readable {kind} table ({err}); replace it with an intact copy"
        ) from None


def _column(df: pd.DataFrame, name: str, key: str, path: Path, what: str) -> pd.Series:
    if name not in df.columns:
        raise ConfigError(
            f"data_args.{key}: {path} has no column {name!r} "
            f"(its columns: {', '.join(map(str, df.columns))}); "
            f"name the column holding {what} in data_args.{key}"
        )
    return df[name]


def features(df: pd.DataFrame, args: DataArgs, path: Path) -> list[str]:
    """The feature columns in the model's order, checked: there, numeric, no gaps, as many as agreed."""
    skip = {args.label_column, args.party_column}
    names = list(args.feature_columns or [c for c in df.columns if c not in skip])
    for name in names:
        col = _column(df, name, "feature_columns", path, "a feature")
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            raise ConfigError(
                f"data_args.feature_columns: {path} column {name!r} holds {col.dtype} values, not numbers; "
                "encode it as numbers, or list only numeric columns in data_args.feature_columns"
            )
        if not np.isfinite(col.to_numpy(dtype=np.float64)).all():
            row = int(np.flatnonzero(~np.isfinite(col.to_numpy(dtype=np.float64)))[0])
            raise DataFileError(
                path, f"column {name!r} has no finite value in row {row}; fill or drop such rows"
            )
    if len(names) != args.channels:
        raise ConfigError(
            f"data_args.channels: {path} has {len(names)} feature columns ({', '.join(map(str, names[:8]))}"
            f"{', ...' if len(names) > 8 else ''}), the run agrees on {args.channels}; "
            "a table's channels are "
            "its feature columns (set data_args.feature_columns to choose them)"
        )
    return names


def frame_split(df: pd.DataFrame, args: DataArgs, path: Path) -> Split:
    """Rows -> x [N, F, 1, 1] in the default float dtype, y class indices [N]."""
    labels = _column(df, args.label_column, "label_column", path, "the class")
    if labels.isna().any():
        row = int(np.flatnonzero(labels.isna().to_numpy())[0])
        raise DataFileError(path, f"row {row} has no {args.label_column!r}; label or drop it")
    if pd.api.types.is_float_dtype(labels) and (labels == labels.round()).all():
        labels = labels.astype(np.int64)  # 3.0 read back from a CSV is the class named "3"
    names = features(df, args, path)
    x = torch.tensor(df[names].to_numpy(dtype=np.float64), dtype=torch.get_default_dtype())
    return x.reshape(len(df), len(names), 1, 1), labels_to_indices(labels.tolist(), args.classes, str(path))


def by_party(frames: dict[str, tuple[pd.DataFrame, Path]], args: DataArgs, make: Callable) -> Owned:
    """{split: (frame, path)} -> party -> (train, test), each made by `make(split, rows, path)`: one
    party per value of the party column (natural, sorted by name), else the whole site."""
    if args.partition_method != "natural":
        out = {s: make(s, df, path) for s, (df, path) in frames.items()}
        return {"": (out["train"], out.get("test"))}
    cols = {s: _column(df, args.party_column, "party_column", p, "each sample's party").astype(str)
            for s, (df, p) in frames.items()}  # fmt: skip
    parties = sorted(set(cols["train"]))
    if "test" in cols and set(cols["test"]) != set(parties):
        odd = sorted(set(cols["test"]) ^ set(parties))
        raise ConfigError(
            f"data_args.party_column: parties {odd[:5]} are in one split but not the other "
            f"({frames['test'][1]}); "
            "every party needs training and test rows (or leave the test split out for a seeded share)"
        )
    out: Owned = {}
    for party in parties:
        split = {s: make(s, df[cols[s] == party], path) for s, (df, path) in frames.items()}
        out[party] = (split["train"], split.get("test"))
    return out


def table(args: DataArgs, root: Path) -> Owned:
    """``root/train.csv`` (or .parquet) and, optionally, ``root/test.*``: features and a label column."""
    train = find_table(root, "train")
    if train is None:
        raise ConfigError(
            f"data_args.data_cache_dir: {root} has no train.csv or train.parquet; a table site holds "
            "train.csv|parquet (and optionally test.csv|parquet): feature columns and a label column"
        )
    test = find_table(root, "test")
    frames = {s: (read_frame(p), p) for s, p in (("train", train), ("test", test)) if p is not None}
    return by_party(frames, args, lambda _, df, path: frame_split(df, args, path))


def hf_splits(root: Path) -> dict[str, tuple[Any, Path]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data_args.dataset: hf reads Hugging Face datasets; install them: pip install 'fedml_moon[hf]'"
        ) from None
    try:
        if any((root / m).is_file() for m in HF_MARKERS):
            loaded = datasets.load_from_disk(str(root))
        else:
            files = sorted(root.rglob("*.parquet"))
            names = {s: [str(f) for f in files if f.name.startswith(s)] for s in ("train", "test")}
            if not names["train"]:
                raise ConfigError(
                    f"data_args.data_cache_dir: {root} is neither a dataset saved with save_to_disk nor a "
                    "folder of train-*.parquet (and test-*.parquet) files"
                )
            loaded = datasets.load_dataset("parquet", data_files={s: f for s, f in names.items() if f})
    except (FileNotFoundError, ValueError, OSError) as err:
        raise DataFileError(root, f"not a readable Hugging Face dataset ({err})") from None
    if isinstance(loaded, datasets.Dataset):
        return {"train": (loaded, root)}
    if "train" not in loaded:
        raise ConfigError(f"data_args.data_cache_dir: {root} has splits {list(loaded)}, no 'train'")
    return {s: (loaded[s], root / s) for s in ("train", "test") if s in loaded}


def hf_split(ds: Any, args: DataArgs, where: Path) -> Split:
    """A Hugging Face split -> images decoded as the image folders' are, labels by their class names."""
    import datasets

    for key, name in (("label_column", args.label_column), ("image_column", args.image_column)):
        if name not in ds.column_names:
            raise ConfigError(
                f"data_args.{key}: {where} has no column {name!r} (its columns: {ds.column_names})"
            )
    feature = ds.features[args.label_column]
    labels = ds[args.label_column]
    if isinstance(feature, datasets.ClassLabel):
        if any(i < 0 for i in labels):  # -1: unlabelled
            row = next(r for r, i in enumerate(labels) if i < 0)
            raise DataFileError(where, f"row {row} has no label ({args.label_column} -1); label or drop it")
        labels = [feature.names[i] for i in labels]
    try:
        raw = ds.cast_column(args.image_column, datasets.Image(decode=False))[args.image_column]
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"data_args.image_column: {where} column {args.image_column!r} holds no images ({err})"
        ) from None
    sources = [r["bytes"] if r.get("bytes") is not None else Path(r["path"]) for r in raw]
    names = [f"{where} row {i}" for i in range(len(sources))]
    x = torch.from_numpy(decode_all(sources, args.channels, args.image_size, names))
    return x, labels_to_indices(labels, args.classes, str(where))


def hf(args: DataArgs, root: Path) -> Owned:
    """A dataset saved with `save_to_disk` (a DatasetDict with train and optionally test, or one Dataset)
    or its parquet files, with an image column and a label column (ClassLabel names or the names)."""
    splits = hf_splits(root)
    if args.partition_method != "natural":
        made = {s: hf_split(ds, args, where) for s, (ds, where) in splits.items()}
        return {"": (made["train"], made.get("test"))}
    frames = {
        s: (ds.select_columns([args.party_column]).to_pandas(), where) for s, (ds, where) in splits.items()
    }

    def make(split: str, rows: pd.DataFrame, where: Path) -> Split:
        return hf_split(splits[split][0].select(rows.index.to_numpy()), args, where)

    return by_party(frames, args, make)
