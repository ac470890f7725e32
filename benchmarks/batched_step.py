"""Where batching parties pays on this machine: one local SGD step of K parties, one after another vs
vmapped (the batched path's step), for a few models and batch sizes.

Each line: model, batch, milliseconds per K-party step sequential and vmapped (the fastest of three
alternating measurements of --repeats steps each).
Last line: `<model>_b<batch>_vmapped_vs_sequential=<ratio> ...` for every setting.

Run: .venv/bin/python benchmarks/batched_step.py [--parties 10] [--threads 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch
import torch.nn.functional as F

from fedml_moon.core.batched import StackedModel, StackedSGD, vmapped
from fedml_moon.core.models import build_model

log = logging.getLogger("batched_step")
SETTINGS = (("simple-cnn", 64), ("simple-cnn", 10), ("mlp", 64), ("mlp", 10))


def _time(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1000


def compare(name: str, batch: int, parties: int, repeats: int) -> float:
    models = [build_model(name, (1, 28, 28), 10, use_head=name != "mlp") for _ in range(parties)]
    x = torch.randn(parties, batch, 1, 28, 28)
    y = torch.randint(0, 10, (parties, batch))
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5) for m in models]

    def sequential() -> None:
        for k, (model, opt) in enumerate(zip(models, opts, strict=True)):
            opt.zero_grad()
            F.cross_entropy(model(x[k])[2], y[k]).backward()
            opt.step()

    stacked = StackedModel(models[0], [m.state_dict() for m in models])
    sgd = StackedSGD(stacked.params, 0.01, 0.9, 1e-5)
    step = vmapped(lambda p, b, xs, ys: F.cross_entropy(stacked.forward(p, b, xs)[2], ys), (0, 0, 0, 0))

    def batched() -> None:
        step(stacked.params, stacked.buffers, x, y).sum().backward()
        sgd.step()

    seq, bat = float("inf"), float("inf")
    for _ in range(3):  # alternating; the fastest of three for each
        seq, bat = min(seq, _time(sequential, repeats)), min(bat, _time(batched, repeats))
    log.info(
        "%s batch %d: sequential %.1f ms, vmapped %.1f ms per %d-party step", name, batch, seq, bat, parties
    )
    return bat / seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(opts.threads)
    ratios = {f"{m.replace('-', '_')}_b{b}": compare(m, b, opts.parties, opts.repeats) for m, b in SETTINGS}
    sys.stdout.write(" ".join(f"{k}_vmapped_vs_sequential={v:.2f}" for k, v in ratios.items()) + "\n")


if __name__ == "__main__":
    main()
