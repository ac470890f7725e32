"""`fedml-moon data DIR`: what a site holds, before a run: classes and counts (per party with a natural
layout), image sizes and modes or a table's columns, the channel mean and std to put in the config,
and every problem found (files that do not decode, files left out, mixed channel counts, gaps)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from fedml_moon.data.images import DECODE_ERRORS, bands, hidden, is_image
from fedml_moon.data.owned import owners
from fedml_moon.data.site import TEST_FOLDERS
from fedml_moon.data.tables import HF_MARKERS, READERS, find_table, read_frame

log = logging.getLogger(__name__)


@dataclass
class Survey:
    """What was found: counts[(party, split)][class], image modes and sizes, per-channel sums."""

    counts: dict[tuple[str, str], Counter] = field(default_factory=dict)
    modes: Counter = field(default_factory=Counter)
    channels: Counter = field(default_factory=Counter)
    sizes: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    sums: dict[int, np.ndarray] = field(default_factory=dict)  # channels -> [3, C]: n, sum, sum of squares
    features: list[str] = field(default_factory=list)

    def add_pixels(self, arr: np.ndarray) -> None:
        """One image's pixels, [H, W] or [H, W, C] uint8."""
        x = arr.reshape(-1, 1 if arr.ndim == 2 else arr.shape[2]).astype(np.float64) / 255.0
        self.add_values(x)

    def add_values(self, x: np.ndarray) -> None:
        """Rows of values [N, C], summed per channel."""
        acc = self.sums.setdefault(x.shape[1], np.zeros((3, x.shape[1])))
        acc += np.stack([np.full(x.shape[1], len(x)), x.sum(0), (x * x).sum(0)])

    def stats(self) -> tuple[int, list[float], list[float]] | None:
        """The most common channel count and its per-channel mean and standard deviation."""
        if not self.sums:
            return None
        channels = max(self.sums, key=lambda c: self.sums[c][0, 0])
        n, s, ss = self.sums[channels]
        mean = s / n
        std = np.sqrt(np.maximum(ss / n - mean * mean, 0.0))
        std = np.where(std < 1e-6, 1.0, std)  # a constant channel: nothing to scale
        return channels, [round(float(m), 4) for m in mean], [round(float(d), 4) for d in std]


def _survey_image(survey: Survey, img: Image.Image, where: str) -> None:
    img.load()
    survey.modes[img.mode] += 1
    survey.channels[bands(img)] += 1
    survey.sizes[img.size] += 1
    if img.mode in ("P", "PA") or bands(img) not in (1, 3, 4) or img.mode not in ("L", "RGB", "RGBA"):
        img = img.convert({1: "L", 3: "RGB", 4: "RGBA"}.get(bands(img), "RGB"))
    survey.add_pixels(np.asarray(img, dtype=np.uint8))


def _image_split(survey: Survey, folder: Path, key: tuple[str, str], root: Path) -> None:
    counts = survey.counts.setdefault(key, Counter())
    for class_dir in sorted(d for d in folder.iterdir() if d.is_dir() and not hidden(d.name)):
        for path in sorted(p for p in class_dir.rglob("*") if p.is_file() and not hidden(p.name)):
            if not is_image(str(path)):
                survey.problems.append(f"left out (no image extension): {path.relative_to(root)}")
                continue
            try:
                with Image.open(path) as img:
                    _survey_image(survey, img, str(path))
            except DECODE_ERRORS as err:
                survey.problems.append(f"does not decode: {path.relative_to(root)} ({err})")
                continue
            counts[class_dir.name] += 1
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        survey.problems.append(f"left out (not in a class folder): {path.relative_to(root)}")


def survey_images(root: Path, natural: bool) -> Survey:
    """An ImageFolder layout (each party's, with `natural`), every image opened and decoded."""
    survey = Survey()
    for party, folder in owners(root, natural).items():
        test = next((s for s in TEST_FOLDERS if (folder / s).is_dir()), None)
        splits = (
            [("train", "train"), *([(test, "test")] if test else [])] if (folder / "train").is_dir() else []
        )
        for name, split in splits or [("", "train")]:
            _image_split(survey, folder / name if name else folder, (party, split), root)
    if len(survey.channels) > 1:
        survey.problems.append(
            f"mixed channel counts {dict(survey.channels)} (modes {dict(survey.modes)}): a run takes one"
        )
    return survey


def survey_table(root: Path, natural: bool, label: str, party: str) -> Survey:
    """train / test tables: label counts (per party), feature columns and their statistics."""
    survey = Survey()
    for split in ("train", "test"):
        path = find_table(root, split)
        if path is None:
            continue
        df = read_frame(path)
        if label not in df.columns:
            survey.problems.append(f"{path.name}: no label column {label!r} (columns: {list(df.columns)})")
            continue
        skip = {label, party} if natural else {label}
        numeric = [c for c in df.columns if c not in skip and _numeric(df[c])]
        survey.problems += [f"{path.name}: column {c!r} is not numeric ({df[c].dtype})"
                            for c in df.columns if c not in skip and c not in numeric]  # fmt: skip
        survey.problems += [f"{path.name}: column {c!r} has {int(df[c].isna().sum())} empty values"
                            for c in numeric if df[c].isna().any()]  # fmt: skip
        survey.features = survey.features or numeric
        if split == "train":
            survey.add_values(df[numeric].dropna().to_numpy(dtype=np.float64))
        if natural and party not in df.columns:
            survey.problems.append(f"{path.name}: no party column {party!r} (columns: {list(df.columns)})")
        groups = df.groupby(df[party].astype(str)) if natural and party in df.columns else [("", df)]
        for name, rows in groups:
            survey.counts[(str(name), split)] = Counter(rows[label].dropna().astype(str))
        if df[label].isna().any():
            survey.problems.append(f"{path.name}: {int(df[label].isna().sum())} rows without a {label!r}")
    if not survey.counts:
        survey.problems.append(f"no train.csv / train.parquet ({', '.join(READERS)}) with a label column")
    return survey


def _numeric(column) -> bool:
    """A column a run takes as a feature: numbers, not booleans (pandas' text dtypes included)."""
    import pandas as pd

    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def detect(root: Path) -> str:
    """imagefolder, table or hf, from what the folder holds."""
    if find_table(root, "train") is not None:
        return "table"
    if any((root / m).is_file() for m in HF_MARKERS) or any(root.rglob("*.parquet")):
        return "hf"
    return "imagefolder"


def survey_hf(root: Path, natural: bool, label: str, party: str, image: str) -> Survey:
    """A saved Hugging Face dataset: label counts (per party), every image decoded."""
    import io

    from fedml_moon.data.tables import hf_splits

    splits = hf_splits(root)  # says how to install datasets when it is missing
    import datasets

    survey = Survey()
    for split, (ds, _) in splits.items():
        missing = [c for c in (label, image) if c not in ds.column_names]
        if missing:
            survey.problems.append(f"split {split}: no column {missing} (columns: {ds.column_names})")
            continue
        feature, labels = ds.features[label], ds[label]
        names = [feature.names[i] for i in labels] if isinstance(feature, datasets.ClassLabel) else labels
        if natural and party not in ds.column_names:
            survey.problems.append(f"split {split}: no party column {party!r} (columns: {ds.column_names})")
        owners_of = [str(p) for p in ds[party]] if natural and party in ds.column_names else [""] * len(ds)
        for who, name in zip(owners_of, names, strict=True):
            survey.counts.setdefault((who, split), Counter())[str(name)] += 1
        raw = ds.cast_column(image, datasets.Image(decode=False))[image]
        for i, r in enumerate(raw):
            try:
                src = io.BytesIO(r["bytes"]) if r.get("bytes") is not None else r["path"]
                with Image.open(src) as img:
                    _survey_image(survey, img, f"{split} row {i}")
            except DECODE_ERRORS as err:
                survey.problems.append(f"does not decode: {split} row {i} ({err})")
    return survey


def _yaml_list(values: list) -> str:
    """A YAML flow list; strings quoted (JSON's quoting is YAML's), so `no` or `01` stay names."""
    return "[" + ", ".join(json.dumps(v) if isinstance(v, str) else str(v) for v in values) + "]"


def _counts_table(survey: Survey, classes: list[str]) -> list[str]:
    width = max([len(c) for c in classes] + [5])
    keys = sorted(survey.counts)
    lines = [
        "samples per class:",
        " " * (width + 2) + "".join(f"{(p + ' ' if p else '') + s:>16}" for p, s in keys),
    ]
    for c in classes:
        lines.append(f"  {c:<{width}}" + "".join(f"{survey.counts[k].get(c, 0):>16}" for k in keys))
    lines.append(f"  {'total':<{width}}" + "".join(f"{sum(survey.counts[k].values()):>16}" for k in keys))
    return lines


def report(root: Path, dataset: str, survey: Survey, natural: bool, agreed: list[str] | None = None,
           checked: tuple[str, ...] = ()) -> str:  # fmt: skip
    """The survey in words, with the config lines that agree with it (`agreed`: the run's classes, in
    its order, else the folder's own, sorted) and the lines of a check by the run's code (`checked`)."""
    held = sorted({c for counts in survey.counts.values() for c in counts})
    classes = list(agreed) + [c for c in held if c not in agreed] if agreed else held
    parties = sorted({p for p, _ in survey.counts if p})
    lines = [
        f"{root}: {dataset}" + (f", {len(parties)} parties ({', '.join(parties[:8])})" if natural else "")
    ]
    lines += _counts_table(survey, classes)
    if survey.modes:
        lines.append(f"image modes: {dict(survey.modes)}")
        sizes = ", ".join(f"{w}x{h}: {n}" for (w, h), n in survey.sizes.most_common(6))
        lines.append(f"image sizes (width x height): {sizes}")
    if survey.features:
        lines.append(f"feature columns ({len(survey.features)}): {', '.join(survey.features)}")
    stats = survey.stats()
    lines += [
        "",
        "config lines that agree with it "
        + (
            "(classes: the run's, in its order, then any others this folder holds):"
            if agreed
            else "(classes: this folder's, sorted; every site must use the run's one list in one order: "
            "check the folder against it with --cf CONFIG):"
        ),
        "data_args:",
        f"  dataset: {dataset}",
        f"  data_cache_dir: {root}",
        f"  classes: {_yaml_list(classes)}",
    ]
    if natural:
        lines.append("  partition_method: natural")
    if stats is not None:
        channels, mean, std = stats
        side = survey.sizes.most_common(1)[0][0][0] if survey.sizes else 1
        lines += [f"  image_size: {side}", f"  channels: {channels}"]
        lines += [f"  normalize_mean: {_yaml_list(mean)}", f"  normalize_std: {_yaml_list(std)}"]
    if natural:
        lines += [
            "train_args:",
            f"  client_num_in_total: {len(parties)}",
            f"  client_num_per_round: {len(parties)}",
        ]
    lines += ["", *checked] + ([""] if checked else [])
    lines += (
        [f"problems ({len(survey.problems)}):"] + [f"  {p}" for p in survey.problems[:50]]
        if survey.problems
        else ["problems: none"]
    )
    if len(survey.problems) > 50:
        lines.append(f"  ... and {len(survey.problems) - 50} more")
    return "\n".join(lines) + "\n"


def survey_of(root: Path, kind: str, natural: bool, label: str = "label", party: str = "party",
              image: str = "image") -> Survey:  # fmt: skip
    """The folder surveyed as `kind` (imagefolder, table, hf); a folder without samples is a problem."""
    if kind == "table":
        survey = survey_table(root, natural, label, party)
    elif kind == "hf":
        survey = survey_hf(root, natural, label, party, image)
    else:
        survey = survey_images(root, natural)
    if not any(sum(c.values()) for c in survey.counts.values()) and not survey.problems:
        survey.problems.append(f"no samples: {_layouts(kind)}")
    return survey


def inspect(root: Path, dataset: str | None = None, natural: bool = False, label: str = "label",
            party: str = "party", image: str = "image") -> tuple[str, int]:  # fmt: skip
    """The report on the folder, and how many problems were found."""
    kind = dataset or detect(root)
    survey = survey_of(root, kind, natural, label, party, image)
    return report(root, kind, survey, natural), len(survey.problems)


def _layouts(kind: str) -> str:
    """Where a format's samples go."""
    if kind == "table":
        return "a table site holds train.csv|parquet (and optionally test.*): feature and label columns"
    if kind == "hf":
        return "a Hugging Face dataset holds a train split with image and label columns"
    return "lay the images out as <class>/<file> or train/<class>/<file> (and test/<class>/<file>)"
