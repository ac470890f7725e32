"""Image files: torchvision's ImageFolder layout listed, every image decoded once (PIL), checked
against the run's agreement (its channels), resized to the run's side and cached as uint8 beside
the data."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension, make_dataset

from fedml_moon.data.formats import DataFileError
from fedml_moon.errors import ConfigError

log = logging.getLogger(__name__)

MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}  # what an image of N channels is converted to
ONE_BAND = {"1", "L", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"}
CACHE_PREFIX = ".fedml_moon-images-"
CHUNK = 512  # images a thread decodes at a time
THREADED_PIXELS = 64 * 64  # images this large (the first one's width x height) decode on threads


def bands(img: Image.Image) -> int:
    """An image's channels: a palette image has 3 (4 with transparency), a grey or binary one 1."""
    if img.mode in ("P", "PA"):
        return 4 if img.mode == "PA" or "transparency" in img.info else 3
    return 1 if img.mode in ONE_BAND else len(img.getbands())


def convert(img: Image.Image, channels: int, side: int, where: Path) -> tuple[np.ndarray, bool]:
    """A decoded image -> uint8 [channels, side, side], and whether it was resized; one with another
    number of channels is refused (DataFileError), naming ``where``."""
    have = bands(img)
    if have != channels:
        raise DataFileError(
            where,
            f"has {have} channel(s) (PIL mode {img.mode}) but the run agrees on data_args.channels: "
            f"{channels}; convert it to mode {MODES.get(channels, 'RGB')} (or, if every site's "
            f"images have {have}, set data_args.channels: {have})",
        )
    if img.mode.startswith("I;16") or img.mode == "I":  # 16-bit grey: scaled, not clipped, to 8 bits
        wide = np.asarray(img, dtype=np.float64)
        img = Image.fromarray(np.round(wide / 257.0 if wide.max() > 255 else wide).astype(np.uint8), mode="L")
    out = img if img.mode == MODES[channels] else img.convert(MODES[channels])
    resized = out.size != (side, side)
    if resized:
        out = out.resize((side, side), Image.BILINEAR)
    arr = np.asarray(out, dtype=np.uint8)
    return (arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)), resized


DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)
"""What PIL raises for a file that is not an image it can decode."""


def decode(
    source: Path | bytes, channels: int, side: int, name: str | None = None
) -> tuple[np.ndarray, bool]:
    """One image file (or its bytes, then called ``name``) -> `convert`'s uint8 [channels, side, side].

    Raises:
        DataFileError: not an image PIL reads, or one with another number of channels.
    """
    where = Path(name or str(source))
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            img.load()
            return convert(img, channels, side, where)
    except DataFileError:
        raise
    except DECODE_ERRORS as err:
        raise DataFileError(
            where, f"not an image that can be decoded ({err}); replace or remove it"
        ) from None


def _pixels(source: Path | bytes) -> int:
    """Width x height from the file's header (0 when it cannot be read: `decode` will say why)."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            return img.size[0] * img.size[1]
    except DECODE_ERRORS:
        return 0


def decode_all(
    sources: Sequence[Path | bytes], channels: int, side: int, names: Sequence[str] = ()
) -> np.ndarray:
    """Many images -> uint8 [N, channels, side, side]; the first bad file stops it, named.

    Images of `THREADED_PIXELS` or more are decoded in chunks on a few threads (PIL lets go of the
    GIL while it decodes and resizes); smaller ones on this thread, where the GIL-bound share of
    each image outweighs the decoding and threads only take turns (benchmarks/site_data.py)."""
    out = np.empty((len(sources), channels, side, side), dtype=np.uint8)
    names = list(names) or [None] * len(sources)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    threads = max(1, min(8, cores)) if sources and _pixels(sources[0]) >= THREADED_PIXELS else 1

    def chunk(start: int) -> int:
        resized = 0
        for i in range(start, min(start + CHUNK, len(sources))):
            out[i], was_resized = decode(sources[i], channels, side, names[i])
            resized += was_resized
        return resized

    starts = range(0, len(sources), CHUNK)
    with ThreadPoolExecutor(threads) as pool:
        resized = sum(pool.map(chunk, starts))
    if resized:
        log.info("resized %d of %d images to %dx%d", resized, len(sources), side, side)
    return out


def list_images(folder: Path, classes: Sequence[str]) -> list[tuple[str, int]]:
    """(path, class index) of every image under ``folder/<class>/`` (torchvision's ImageFolder layout,
    files with an image extension, sub-folders included), sorted; a class folder the run's classes do
    not name is refused, naming it."""
    try:
        found = [c for c in find_classes(str(folder))[0] if not hidden(c)]
        if not found:
            raise FileNotFoundError(folder)
    except FileNotFoundError:
        raise ConfigError(
            f"data_args.data_cache_dir: {folder} has no class folders; lay the images out as "
            "<class>/<file> (torchvision's ImageFolder), the folder names in data_args.classes"
        ) from None
    unknown = [c for c in found if c not in classes]
    if unknown:
        raise ConfigError(
            f"data_args.classes: {folder / unknown[0]} holds a class the run does not name "
            f"({', '.join(unknown)}; the run's: {', '.join(classes)}); add it to data_args.classes "
            "(every site the same list, in the same order) or move the folder out of the data"
        )
    index = {c: i for i, c in enumerate(classes)}
    return make_dataset(str(folder), {c: index[c] for c in found}, is_valid_file=is_image, allow_empty=True)


def hidden(name: str) -> bool:
    """Left out of the data: dot-files and dot-folders (``.DS_Store``, macOS's ``._x.png``,
    ``.ipynb_checkpoints``) and macOS archives' ``__MACOSX``."""
    return name.startswith(".") or name == "__MACOSX"


def is_image(path: str) -> bool:
    """A file the image folders read: one of torchvision's image extensions, not hidden."""
    return has_file_allowed_extension(path, IMG_EXTENSIONS) and not hidden(os.path.basename(path))


def _fingerprint(root: Path, paths: Sequence[Path], channels: int, side: int) -> str:
    """Paths below `root` (a folder moved or copied with its times keeps its cache), sizes, times."""
    h = hashlib.sha256(json.dumps([1, channels, side]).encode())
    for p in paths:
        try:
            st = os.stat(p)
        except OSError as err:  # a broken link, a file gone while listing
            raise DataFileError(Path(p), f"cannot be read ({err.strerror}); fix or remove it") from None
        h.update(f"{Path(p).relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedml_moon"


def _read_cache(places: list[Path], n: int, channels: int, side: int) -> np.ndarray | None:
    for path in places:
        if not path.is_file():
            continue
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            log.warning("ignoring the unreadable image cache %s (%s); decoding again", path, err)
            continue
        if arr.dtype == np.uint8 and arr.shape == (n, channels, side, side):
            log.info("decoded images from the cache %s", path)
            return arr
        log.warning(
            "ignoring the image cache %s: shape %s, not %s", path, arr.shape, (n, channels, side, side)
        )
    return None


def _write_cache(places: list[Path], arr: np.ndarray) -> None:
    for path in places:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, arr, allow_pickle=False)
            os.replace(tmp, path)  # whole or not at all: processes reading the same folder race safely
        except OSError as err:
            Path(tmp).unlink(missing_ok=True)
            log.warning("could not write the image cache %s: %s", path, err)
            continue
        log.info("cached the decoded images in %s", path)
        return
    log.warning("no writable place for the image cache among %s", [str(p) for p in places])


def cached_decode(root: Path, paths: Sequence[Path], channels: int, side: int) -> np.ndarray:
    """`decode_all` of ``paths``, kept in ``root/.fedml_moon-images-<digest>.npy`` (or under
    ``~/.cache/fedml_moon`` where ``root`` is read-only). The digest covers every file's path below
    ``root``, size and modification time and the run's channels and side: a changed, added or removed
    file decodes the folder anew."""
    name = f"{CACHE_PREFIX}{_fingerprint(root, paths, channels, side)}.npy"
    places = [Path(root) / name, _user_cache() / name]
    if not os.access(root, os.W_OK):
        places = places[1:] + places[:1]
    cached = _read_cache(places, len(paths), channels, side)
    if cached is not None:
        return cached
    log.info("decoding %d images under %s", len(paths), root)
    arr = decode_all(paths, channels, side)
    _write_cache(places, arr)
    return arr
