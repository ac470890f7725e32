"""How fast each network trains: samples per second of one party's local epoch of MOON (its loss
takes three forwards a step: the party's model, the global model and its previous one), through
the engine's own party path, for each built-in encoder and for torchvision's ResNet-18 at 32x32 and
224x224.

The data are real: Fashion-MNIST written as one party's PNG folder (grey, and in three channels for
the RGB networks; the reader resizes them to each setting's side). Each setting trains one epoch
once to warm up, then --repeats epochs; the line says samples per second of the fastest. The last
line: `<setting>=<samples/s> ...`, and the machine.

Run: .venv/bin/python benchmarks/networks.py [--samples 256] [--repeats 2] [--threads 2] [--gpu]
(--gpu: on the GPU, device_args.using_gpu: true; where none is visible the run says so and uses the CPU)
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.conformance.inprocess import quiet

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.site_data import CLASSES, fashion, write_pngs  # noqa: E402

log = logging.getLogger("networks")
CONFIG = Path(__file__).resolve().parent.parent / "config" / "networks" / "resnet18.yaml"
SETTINGS = (  # name, model, channels, side, batch
    ("simple-cnn", "simple-cnn", 1, 28, 64),
    ("lg-cnn", "lg-cnn", 1, 28, 64),
    ("mlp", "mlp", 1, 28, 64),
    ("resnet50-cifar-stem-32", "resnet50", 3, 32, 64),
    ("torchvision-resnet18-32", "torchvision:resnet18", 3, 32, 64),
    ("torchvision-resnet18-224", "torchvision:resnet18", 3, 224, 32),
)


def write_party(root: Path, samples: int, mode: str) -> Path:
    """One party's folder of `samples` Fashion-MNIST training images (and a few test images)."""
    x, y, xt, yt = fashion(samples, 20)
    write_pngs(root / mode / "train", x, y, mode=mode)
    write_pngs(root / mode / "test", xt, yt, mode=mode)
    return root / mode


def epoch_rate(folder: Path, model: str, channels: int, side: int, batch: int, args) -> float:
    """Samples per second of the fastest of `args.repeats` local epochs of one party."""
    sets = [
        f"data_args.data_cache_dir={folder}",
        f"data_args.classes=[{','.join(CLASSES)}]",
        "data_args.partition_method=homo",
        f"data_args.image_size={side}",
        f"data_args.channels={channels}",
        f"model_args.model={model}",
        "train_args.client_num_in_total=1",
        "train_args.client_num_per_round=1",
        "train_args.epochs=1",
        f"train_args.batch_size={batch}",
        f"device_args.torch_threads={args.threads}",
        f"device_args.using_gpu={str(args.gpu).lower()}",
        "train_args.state_store=memory",
    ]
    with quiet(), tempfile.TemporaryDirectory() as out:
        run = assemble(load_config(CONFIG, sets), Path(out))
        runner, server = run.loop.runner, run.loop.server.aggregator
        n = int(run.dataset.train_data_local_num_dict[0])
        samples = n - n % batch  # the last incomplete batch is dropped (train_args.drop_last)
        best = float("inf")
        for i in range(args.repeats + 1):
            started = time.perf_counter()
            runner.train_many([(0, server.get_model_params_for(0))], i)
            if i:  # the first epoch warms up
                best = min(best, time.perf_counter() - started)
    return samples / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=256, help="the party's training images")
    parser.add_argument("--repeats", type=int, default=2, help="timed epochs per setting (the fastest)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--gpu", action="store_true", help="train on the GPU (device_args.using_gpu: true)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {mode: write_party(Path(tmp), args.samples, mode) for mode in ("L", "RGB")}
        for name, model, channels, side, batch in SETTINGS:
            folder = folders["RGB" if channels == 3 else "L"]
            rates[name] = epoch_rate(folder, model, channels, side, batch, args)
            shape = f"{channels}x{side}x{side}"
            log.info("%s: %.1f samples/s (batch %d, %s)", name, rates[name], batch, shape)
    if args.gpu and torch.cuda.is_available():
        machine = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    else:
        cpu = platform.processor() or platform.machine()
        machine = f"{cpu}, {args.threads} threads, torch {torch.__version__}"
    log.info("%s (%s)", " ".join(f"{k}={v:.1f}" for k, v in rates.items()), machine)


if __name__ == "__main__":
    main()
