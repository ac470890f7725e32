"""One MOON round of the paper's CIFAR-10 setting, parties one after another vs all parties batched.

Setting (MOON paper, section 4.1): 10 parties, Dir(0.5), 10 local epochs, simple CNN with the
projection head, batch 64, lr 0.01, momentum 0.9, weight decay 1e-5, mu 5, tau 0.5, one negative (the
party's own initial model, as in round 1). Data: real CIFAR-10 from `--data DIR` (torchvision's
`cifar-10-batches-py`; a missing or unreadable folder is an error), without it random uint8 tensors
of CIFAR-10's shape (50,000 x 3 x 32 x 32; the output says which). On a GPU the data set is resident
on the device. Each mode runs in its own child process, so each reports its own peak memory (CUDA:
max allocated; CPU: peak resident set size).
The MOON paper's reference: 337 s per round on a V100.

Three modes: parties one after another, batched (`parties_in_parallel: 10`), and batched with each
step of full batches replayed from a CUDA graph (`cuda_graphs: true`; CUDA only). Last line:
    device=<name> data=<real|random> sequential_s=<s> batched_s=<s> graphs_s=<s> speedup=<x>
    graphs_speedup=<x> sequential_samples_per_s=<n> batched_samples_per_s=<n> graphs_samples_per_s=<n>
    sequential_peak_mb=<mb> batched_peak_mb=<mb> graphs_peak_mb=<mb>

Run: .venv/bin/python benchmarks/gpu_round.py [--data DIR] [--device cuda] [--epochs 10] [--samples N]
(--samples keeps the first N training images: small runs that check the plumbing on a CPU)
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import resource
import sys
import time
from queue import Empty

import torch

from fedml_moon.algorithms.base import PartyRound
from fedml_moon.algorithms.moon import MoonClient, MoonOptions
from fedml_moon.config_schema import TrainArgs
from fedml_moon.core.models import build_model
from fedml_moon.core.partition import dirichlet_partition
from fedml_moon.data.datasets import DatasetTensors, load_dataset
from fedml_moon.data.loader import build_fedml_dataset
from fedml_moon.engine.batched import train_parties, train_party
from fedml_moon.engine.local import PartyJob

log = logging.getLogger("gpu_round")
PARTIES = 10


def cifar10(folder: str | None, samples: int | None) -> tuple[DatasetTensors, str]:
    """Real CIFAR-10 from `folder` (an error if it is not there: a named source is never replaced),
    else random tensors of its shape."""
    if folder:
        data, source = load_dataset("cifar10", folder), "real"
    else:
        log.info("no --data: random tensors of CIFAR-10's shape")
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (50_000, 3, 32, 32), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 10, (50_000,), generator=g)
        norm = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        data, source = DatasetTensors("cifar10", x, y, x[:10], y[:10], 10, *norm, "cifar10"), "random"
    if samples:
        data.x_train, data.y_train = data.x_train[:samples], data.y_train[:samples]
    return data, source


def one_round(mode: str, opts: argparse.Namespace, queue: mp.Queue) -> None:
    """Child process: build everything, time one round in `mode`, report time, samples and memory."""
    torch.manual_seed(0)
    device = torch.device(opts.device)
    data, source = cifar10(opts.data, opts.samples)
    parts = dirichlet_partition(data.y_train.numpy(), PARTIES, 0.5, seed=0)
    resident = device.type == "cuda"
    loaders = build_fedml_dataset(
        data, parts, None, 64, 0, True, device=device, resident=resident
    ).train_data_local_dict
    train = TrainArgs(epochs=opts.epochs, batch_size=64, learning_rate=0.01, momentum=0.9, weight_decay=1e-5)
    train.cuda_graphs = mode == "graphs"  # batched steps of full batches replayed from a CUDA graph

    def factory() -> torch.nn.Module:
        return build_model("simple-cnn", (3, 32, 32), 10, use_head=True, out_dim=256)

    algo = MoonClient(MoonOptions(mu=5.0, temperature=0.5), train, factory, 0)
    received = {"model": {k: v.to(device) for k, v in factory().state_dict().items()}}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    if mode != "sequential":
        names = tuple(n for n, p in factory().named_parameters() if p.requires_grad)
        jobs = [PartyJob(PartyRound(received, {}, 1, p, names), loaders[p]) for p in range(PARTIES)]
        train_parties(algo, factory().to(device), jobs, device)
    else:
        model = factory()
        for p in range(PARTIES):
            train_party(algo, model, received, {}, loaders[p], device, 1, p)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = time.perf_counter() - started
    samples = sum(len(loaders[p]) * 64 for p in range(PARTIES)) * opts.epochs
    queue.put({"seconds": seconds, "samples": samples, "peak": peak, "source": source})


def _result(mode: str, child: mp.Process, queue: mp.Queue) -> dict:
    """The child's report; an error naming the mode if the child died without one."""
    while True:
        try:
            return queue.get(timeout=1)
        except Empty:
            if child.exitcode is not None:
                raise SystemExit(f"the {mode} round failed (exit code {child.exitcode}); see above") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="folder with cifar-10-batches-py")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=None)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ctx = mp.get_context("spawn")
    results = {}
    modes = (
        ("sequential", "batched", "graphs") if opts.device.startswith("cuda") else ("sequential", "batched")
    )
    for mode in modes:
        queue = ctx.Queue()
        child = ctx.Process(target=one_round, args=(mode, opts, queue))
        child.start()
        results[mode] = _result(mode, child, queue)
        child.join()
        log.info("%s: %s", mode, json.dumps(results[mode]))
    name = torch.cuda.get_device_name(opts.device) if opts.device.startswith("cuda") else "cpu"
    seq = results["sequential"]
    fields = [f"device={name.replace(' ', '_')}", f"data={seq['source']}"]
    fields += [f"{mode}_s={results[mode]['seconds']:.2f}" for mode in modes]
    fields += [f"speedup={seq['seconds'] / results['batched']['seconds']:.2f}"]
    if "graphs" in results:
        fields += [f"graphs_speedup={seq['seconds'] / results['graphs']['seconds']:.2f}"]
    fields += [
        f"{mode}_samples_per_s={results[mode]['samples'] / results[mode]['seconds']:.0f}" for mode in modes
    ]
    fields += [f"{mode}_peak_mb={results[mode]['peak'] / 2**20:.0f}" for mode in modes]
    sys.stdout.write(" ".join(fields) + "\n")


if __name__ == "__main__":
    main()
