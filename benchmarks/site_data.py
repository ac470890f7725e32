"""A site's image folder: decoding it once, and starting again from the cache.

Writes `--images` Fashion-MNIST training images (and a fifth as many test images) as PNG files in
torchvision's ImageFolder layout (`train/<class>/`, `test/<class>/`), optionally upscaled to
`--side` pixels and saved as RGB (`--rgb`) to look like photographs, then loads the folder as a run
does (`data.site.load_site`: list, decode on a few threads, resize to `--image-size`, cache) three
ways, each in a fresh process, one after another:

  cold       no cache: every file decoded (PIL) and the uint8 array cached beside the data
  cached     a second start-up: the file list checked (sizes and times) and the cache read
  one-thread the cold decode on one core (the cache removed first), for the threads' share
The cold decodes run twice on all cores and twice on one, alternated; each figure is the faster.

Printed: seconds and images/s of each, and the ratios `cached_vs_cold` (start-up from the cache /
the first start-up; below 1 is faster) and `threads_vs_one` (the threaded decode / one thread).

Run: .venv/bin/python benchmarks/site_data.py [--images 20000] [--side 28] [--rgb] [--image-size N]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("site_data")


def write(folder: Path, images: int, side: int, rgb: bool) -> int:
    """The folder of PNGs; returns how many files."""
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(ROOT / "examples" / "site_data"))
    from write import CLASSES, fashion

    x, y, xt, yt = fashion(images, images // 5)
    n = 0
    for split, xs, ys in (("train", x, y), ("test", xt, yt)):
        for i, (img, label) in enumerate(zip(xs, ys, strict=True)):
            pic = Image.fromarray(np.asarray(img), mode="L")
            pic = pic.resize((side, side), Image.BILINEAR) if side != 28 else pic
            target = folder / split / CLASSES[int(label)] / f"{i:06d}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            (pic.convert("RGB") if rgb else pic).save(target)
            n += 1
    return n


def timed_load(folder: Path, channels: int, image_size: int, threads: int) -> float:
    """Seconds `load_site` takes in a fresh process (imports not counted)."""
    code = f"""
import json, os, time
os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:{threads}])) if {threads} else None
from fedml_moon.config.schema import DataArgs
from fedml_moon.data.site import load_site
from tests.support.site_data import CLASSES
args = DataArgs(dataset="imagefolder", data_cache_dir={str(folder)!r}, classes=CLASSES,
                image_size={image_size}, channels={channels})
args.check()
args.check_agreement()
start = time.perf_counter()
held = load_site(args, 0)
print(json.dumps({{"s": time.perf_counter() - start, "n": len(held.y_train) + len(held.y_test)}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20000, help="training images (test: a fifth as many)")
    parser.add_argument("--side", type=int, default=28, help="the files' side in pixels")
    parser.add_argument("--rgb", action="store_true", help="save the files as RGB")
    parser.add_argument("--image-size", type=int, default=None, help="the run's side (default: --side)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    channels, size = (3 if args.rgb else 1), args.image_size or args.side
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "site"
        n = write(folder, args.images, args.side, args.rgb)
        cold = timed_load(folder, channels, size, 0)
        cached = timed_load(folder, channels, size, 0)
        colds, ones = [cold], []
        for threads in (1, 0, 1):  # alternated: neither is favoured by coming first
            for cache in folder.glob(".fedml_moon-images-*.npy"):
                cache.unlink()
            (ones if threads else colds).append(timed_load(folder, channels, size, threads))
        cold, one = min(colds), min(ones)
    kind = f"{args.side}x{args.side} {'RGB' if args.rgb else 'grey'} PNG -> {size}x{size}"
    log.info("%d files (%s)", n, kind)
    for name, s in (("cold", cold), ("cached", cached), ("one-thread", one)):
        log.info("%-10s %7.2f s  %9.0f images/s", name, s, n / s)
    log.info("cached_vs_cold=%.3f threads_vs_one=%.3f", cached / cold, cold / one)


if __name__ == "__main__":
    main()
