"""Peak memory of a many-party MOON run with ResNet-50, party state in memory vs on disk.

Setting (the MOON paper's 100-party CIFAR-100 setting, shrunk in samples and rounds): MOON with
ResNet-50 (CIFAR stem, projection head; a party's model state is 98 MB), CIFAR-100-shaped data, 100
parties (`--parties`), every party sampled in every round, 10 samples each (IID), batch 10, one local
epoch, 2 rounds, so that in round 1 every party holds a pool (its previous model). Each run streams
its uploads (`train_args.stream_uploads`: one chunk of uploads held at a time, not the round's) and
differs only in `train_args.state_store` (memory: 100 pools held by the process; disk: one file per
party, loaded for the parties being trained). Data: CIFAR-100 from `--data DIR` (`cifar-100-python`;
an unreadable folder is an error), without it random images written in that format to a temporary
folder (the output says which). Each run is the real entry point (`fedml-moon simulate`) in its own
process, on one thread; its peak resident set size is read from the kernel when it exits
(getrusage of a wrapper process that runs only it).

Last line:
    parties=<n> data=<real|random> memory_peak_mb=<mb> disk_peak_mb=<mb> memory_round_s=<s>
    disk_round_s=<s> disk_vs_memory_round=<x> disk_peak_target_4096_mb=<met|missed>

Run: .venv/bin/python benchmarks/party_memory.py [--parties 100] [--data DIR] [--gpu]
(--gpu: train on the GPU at the run's default pace there; peak resident memory is still the host's)
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger("party_memory")
ROOT = Path(__file__).resolve().parent.parent
CLI = [str(ROOT / ".venv" / "bin" / "fedml-moon"), "simulate", "--cf", "config/paper/cifar100_moon.yaml"]
PER_PARTY = 10


def write_cifar100(folder: Path, n_train: int, n_test: int) -> None:
    """Random images in the `cifar-100-python` format (pickled dicts of arrays, as torchvision's)."""
    rng = np.random.default_rng(0)
    out = folder / "cifar-100-python"
    out.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 100, n)]
        batch = {b"data": data, b"fine_labels": labels, b"batch_label": name.encode()}
        (out / name).write_bytes(pickle.dumps(batch, protocol=2))


def settings(parties: int, data: Path, store: str, out: Path, gpu: bool) -> list[str]:
    sets = [
        "data_args.partition_method=homo",
        f"data_args.data_cache_dir={data}",
        f"data_args.max_train_samples={parties * PER_PARTY}",
        "data_args.max_test_samples=100",
        f"train_args.client_num_in_total={parties}",
        f"train_args.client_num_per_round={parties}",
        "train_args.comm_round=2",
        "train_args.epochs=1",
        f"train_args.batch_size={PER_PARTY}",
        "train_args.checkpoint_every=0",
        "train_args.stream_uploads=true",
        f"train_args.state_store={store}",
        f"device_args.using_gpu={'true' if gpu else 'false'}",
        "device_args.torch_threads=1",
        "tracking_args.enable_wandb=false",
    ]
    return [*CLI, *(a for s in sets for a in ("--set", s)), "--output-dir", str(out)]


def child(argv: list[str]) -> None:
    """Wrapper process: run `argv` alone and print its peak RSS (bytes) as JSON."""
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(done.returncode)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    sys.stdout.write(json.dumps({"peak": peak}) + "\n")


def one_run(parties: int, data: Path, store: str, work: Path, gpu: bool) -> dict:
    out = work / store
    argv = settings(parties, data, store, out, gpu)
    wrapper = [sys.executable, __file__, "--child", json.dumps(argv)]
    done = subprocess.run(wrapper, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {store} run failed:\n{done.stderr}")
    peak = json.loads(done.stdout.strip().splitlines()[-1])["peak"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result = {"peak": peak, "round_s": records[-1]["round_time_s"]}  # round 1: every party has a pool
    log.info("state_store %s: %s", store, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, default=100)
    parser.add_argument("--data", default=None, help="folder with cifar-100-python")
    parser.add_argument("--gpu", action="store_true", help="train on the GPU (the run's default pace there)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(json.loads(opts.child))
        return
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if opts.data:
            data, source = Path(opts.data), "real"
        else:
            data, source = work / "data", "random"
            write_cifar100(data, opts.parties * PER_PARTY, 100)
            log.info("no --data: random images of CIFAR-100's shape in %s", data)
        runs = {store: one_run(opts.parties, data, store, work, opts.gpu) for store in ("memory", "disk")}
    mem, disk = runs["memory"], runs["disk"]
    fields = [
        f"parties={opts.parties}",
        f"data={source}",
        f"memory_peak_mb={mem['peak'] / 2**20:.0f}",
        f"disk_peak_mb={disk['peak'] / 2**20:.0f}",
        f"memory_round_s={mem['round_s']:.1f}",
        f"disk_round_s={disk['round_s']:.1f}",
        f"disk_vs_memory_round={disk['round_s'] / mem['round_s']:.2f}",
        f"disk_peak_target_4096_mb={'met' if disk['peak'] <= 4096 * 2**20 else 'missed'}",
    ]
    sys.stdout.write(" ".join(fields) + "\n")


if __name__ == "__main__":
    main()
