"""One MOON round of the paper's settings: parties one after another vs batched, on one device.

Settings (`--setting`; MOON paper, section 4.1: 10 parties, Dir(0.5), batch 64, lr 0.01, momentum 0.9,
weight decay 1e-5, tau 0.5, one negative, the party's own initial model, as in round 1):
* `cifar10-cnn` (default): the simple CNN with the projection head on CIFAR-10, mu 5, 10 local epochs.
  The MOON paper's reference: 337 s per round on a V100.
* `cifar100-resnet50`: ResNet-50 (CIFAR stem) with the projection head on CIFAR-100, mu 1, 10 local
  epochs, CIFAR-100's augmentation (crop, flip, rotation). The paper: 31 minutes per round on a V100.
Data: real CIFAR from `--data DIR` (torchvision's `cifar-10-batches-py` / `cifar-100-python`; a missing
or unreadable folder is an error), without it random uint8 tensors of the data set's shape (50,000 x 3
x 32 x 32; the output says which). On a GPU the data set is resident on the device. Each mode runs in
its own child process, so each reports its own peak memory (CUDA: max allocated; CPU: peak resident set).

Modes (`--modes`; default: every mode the device runs): `sequential` (parties one after another, fp32,
eager), `sequential-bf16` (the same under bf16 autocast), `sequential-graphs` and
`sequential-graphs-bf16` (each party's step replayed from its own CUDA graph); `batched`
(`parties_in_parallel: 10`, `together: stacked`, fp32), `graphs` (stacked, each step of full batches
replayed from a CUDA graph) and `graphs-tf32`; `streams`, `streams-tf32` and `streams-bf16` (the 10
parties each on its own model copy and CUDA stream, each step from its own graph on CUDA). The graph
and tf32 modes need CUDA. `--channels-last` puts the model in channels-last layout; `--profile` runs
each round under the PyTorch profiler and adds `<mode>_kernel_s`, the summed time of its CUDA kernels
(to set against the wall time, which the profiler slows). Per mode the last line gives seconds,
samples per second and peak memory, and `<mode>_round_s`: the paper's whole round (10 epochs of all
50,000 samples) at the measured rate:
    device=<name> setting=<name> data=<real|random> layout=<layout> <mode>_s=<s>
    <mode>_samples_per_s=<n> <mode>_peak_mb=<mb> <mode>_round_s=<s> ... fastest=<mode>
    speedup=<fastest vs sequential>

Run: .venv/bin/python benchmarks/gpu_round.py [--setting cifar100-resnet50] [--data DIR] [--device cuda]
[--epochs 10] [--samples N] [--modes sequential batched] [--channels-last] [--profile]
(--samples keeps the first N training images: short runs, and runs that check the plumbing on a CPU)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
import resource
import sys
import time
from collections.abc import Iterator
from queue import Empty

import torch

from fedml_moon.algorithms.base import PartyRound
from fedml_moon.algorithms.moon import MoonClient, MoonOptions
from fedml_moon.config.schema import TrainArgs
from fedml_moon.core.models import build_model
from fedml_moon.core.partition import dirichlet_partition
from fedml_moon.data.datasets import DatasetTensors, load_dataset
from fedml_moon.data.loader import build_fedml_dataset
from fedml_moon.engine.batched import train_parties, train_party
from fedml_moon.engine.local import PartyJob

log = logging.getLogger("gpu_round")
PARTIES = 10
PAPER_SAMPLE_EPOCHS = 500_000  # 10 local epochs of CIFAR's 50,000 training images
SETTINGS = {  # name: (data set, classes, model, mu, augmentation)
    "cifar10-cnn": ("cifar10", 10, "simple-cnn", 5.0, "cifar10"),
    "cifar100-resnet50": ("cifar100", 100, "resnet50", 1.0, "cifar100"),
}
MODES = {  # name: (parties in parallel, CUDA graphs, precision, together)
    "sequential": (1, False, "fp32", "stacked"),
    "sequential-bf16": (1, False, "bf16", "stacked"),
    "sequential-graphs": (1, True, "fp32", "stacked"),
    "sequential-graphs-bf16": (1, True, "bf16", "stacked"),
    "batched": (PARTIES, False, "fp32", "stacked"),
    "graphs": (PARTIES, True, "fp32", "stacked"),
    "graphs-tf32": (PARTIES, True, "tf32", "stacked"),
    "streams": (PARTIES, True, "fp32", "streams"),
    "streams-tf32": (PARTIES, True, "tf32", "streams"),
    "streams-bf16": (PARTIES, True, "bf16", "streams"),
}
GRAPHS_ONLY_ON_CUDA = ("graphs", "graphs-tf32", "sequential-graphs", "sequential-graphs-bf16")


def cifar(setting: str, folder: str | None, samples: int | None) -> tuple[DatasetTensors, str]:
    """Real CIFAR-10 / CIFAR-100 from `folder` (an error if it is not there: a named source is never
    replaced), else random tensors of its shape."""
    name, classes, _, _, augment = SETTINGS[setting]
    if folder:
        data, source = load_dataset(name, folder), "real"
    else:
        log.info("no --data: random tensors of %s's shape", name)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (50_000, 3, 32, 32), generator=g, dtype=torch.uint8)
        y = torch.randint(0, classes, (50_000,), generator=g)
        norm = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        data, source = DatasetTensors(name, x, y, x[:10], y[:10], classes, *norm, augment), "random"
    if samples:
        data.x_train, data.y_train = data.x_train[:samples], data.y_train[:samples]
    return data, source


def one_round(mode: str, opts: argparse.Namespace, queue: mp.Queue) -> None:
    """Child process: build everything, time one round in `mode`, report time, samples and memory."""
    torch.manual_seed(0)
    device = torch.device(opts.device)
    data, source = cifar(opts.setting, opts.data, opts.samples)
    _, classes, model_name, mu, _ = SETTINGS[opts.setting]
    parts = dirichlet_partition(data.y_train.numpy(), PARTIES, 0.5, seed=0)
    loaders = build_fedml_dataset(
        data, parts, None, 64, 0, True, device=device, resident=device.type == "cuda"
    ).train_data_local_dict
    parallel, graphs, precision, together = MODES[mode]
    train = TrainArgs(
        epochs=opts.epochs,
        batch_size=64,
        learning_rate=0.01,
        momentum=0.9,
        weight_decay=1e-5,
        precision=precision,
        together=together,
        cuda_graphs=graphs and device.type == "cuda",  # steps of full batches replayed from a graph
    )
    layout = torch.channels_last if opts.channels_last else torch.contiguous_format

    def factory() -> torch.nn.Module:
        model = build_model(model_name, (3, 32, 32), classes, use_head=True, out_dim=256)
        return model.to(memory_format=layout)

    algo = MoonClient(MoonOptions(mu=mu, temperature=0.5), train, factory, 0)
    received = {"model": {k: v.to(device) for k, v in factory().state_dict().items()}}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with _kernels(opts.profile and device.type == "cuda") as kernel_s:
        started = time.perf_counter()
        if parallel > 1:
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
    samples = sum(min(loaders[p].num_samples, len(loaders[p]) * 64) for p in range(PARTIES)) * opts.epochs
    report = {"seconds": seconds, "samples": samples, "peak": peak, "source": source}
    queue.put({**report, "kernel_s": kernel_s[0]} if kernel_s else report)


@contextlib.contextmanager
def _kernels(on: bool) -> Iterator[list[float]]:
    """With `on`, the round runs under the PyTorch profiler and the list holds, after it, the summed
    time of the CUDA kernels it ran (seconds; concurrent kernels each count)."""
    found: list[float] = []
    if not on:
        yield found
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield found
    events = prof.key_averages()
    found.append(sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6)


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
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="cifar10-cnn")
    parser.add_argument("--data", default=None, help="folder with cifar-10-batches-py / cifar-100-python")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=None)
    parser.add_argument("--channels-last", action="store_true", help="the model in channels-last layout")
    parser.add_argument("--profile", action="store_true", help="also sum the CUDA kernels' time")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cuda = opts.device.startswith("cuda")
    modes = opts.modes or [m for m in MODES if cuda or (m not in GRAPHS_ONLY_ON_CUDA and "tf32" not in m)]
    if not cuda and any(m in GRAPHS_ONLY_ON_CUDA or "tf32" in m for m in modes):
        parser.error(f"{', '.join(GRAPHS_ONLY_ON_CUDA)} and the tf32 modes need a CUDA device")
    ctx = mp.get_context("spawn")
    results = {}
    for mode in modes:
        queue = ctx.Queue()
        child = ctx.Process(target=one_round, args=(mode, opts, queue))
        child.start()
        results[mode] = _result(mode, child, queue)
        child.join()
        log.info("%s: %s", mode, json.dumps(results[mode]))
    sys.stdout.write(_line(opts, results) + "\n")


def _line(opts: argparse.Namespace, results: dict[str, dict]) -> str:
    """The result line: per mode seconds, rate, peak memory and the paper's whole round at that rate."""
    cuda = opts.device.startswith("cuda")
    name = torch.cuda.get_device_name(opts.device) if cuda else "cpu"
    first = next(iter(results.values()))
    fields = [f"device={name.replace(' ', '_')}", f"setting={opts.setting}", f"data={first['source']}"]
    fields.append(f"layout={'channels_last' if opts.channels_last else 'contiguous'}")
    rates = {mode: r["samples"] / r["seconds"] for mode, r in results.items()}
    for mode, r in results.items():
        fields += [f"{mode}_s={r['seconds']:.2f}", f"{mode}_samples_per_s={rates[mode]:.0f}"]
        if "kernel_s" in r:
            fields.append(f"{mode}_kernel_s={r['kernel_s']:.2f}")
        fields += [
            f"{mode}_peak_mb={r['peak'] / 2**20:.0f}",
            f"{mode}_round_s={PAPER_SAMPLE_EPOCHS / rates[mode]:.1f}",
        ]
    fastest = max(rates, key=rates.__getitem__)
    fields.append(f"fastest={fastest}")
    if "sequential" in rates:
        fields.append(f"speedup={rates[fastest] / rates['sequential']:.2f}")
    return " ".join(fields)


if __name__ == "__main__":
    main()
