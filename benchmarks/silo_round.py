"""One silo's local round with 1 and with 2 processes (a hierarchical silo's group, gloo on 127.0.0.1).

The default job's data and model (config/fashion_mnist/moon.yaml: Fashion-MNIST from Debian's package,
simple CNN with its projection head, batch 64) with one silo holding all 60,000 training images
(`--parties 1`; more parties split them by Dir(0.5)), MOON, 1 local epoch of party 0 in round 1
(so MOON has its previous model): timed once alone (one process, one PyTorch thread) and
once as a group of `--procs` processes (one thread each), each step's batch split across them and
the gradients summed (`engine.data_parallel`). Both start from the same download and state, and the
group's trained model is compared with the lone process's. Printed: the seconds of each, the
largest difference of the two trained models, and the ratio `group_vs_one` (group time / one
process time; below 1 the group is faster). On a machine with as many cores as processes the ideal
is 1/procs; the all-reduce of every step's gradients and the per-process Python work are the cost.

Run: .venv/bin/python benchmarks/silo_round.py [--procs 2] [--epochs 1] [--parties 1] [--batch 64]
     [--precision fp32]
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "fashion_mnist" / "moon.yaml"
log = logging.getLogger("silo_round")


def local_round(folder: Path, extra: list[str], group=None) -> tuple[float, dict]:
    """Party 0's round 1 after a round 0 (untimed): (seconds, its upload's model)."""
    from fedml_moon.adapters.run import assemble
    from fedml_moon.config.load import load_config
    from fedml_moon.engine.data_parallel import active

    sets = ["tracking_args.enable_wandb=false", "device_args.torch_threads=1", *extra]
    run = assemble(load_config(CONFIG, sets), folder)
    torch.set_num_threads(1)
    server, runner = run.loop.server, run.loop.runner
    download = copy.deepcopy(server.aggregator.get_model_params_for(0))
    with active(group):
        runner.train(0, download, 0)
        started = time.perf_counter()
        _, upload = runner.train(0, download, 1)
    return time.perf_counter() - started, {k: v.detach().clone() for k, v in upload["model"].items()}


def _member(rank: int, procs: int, port: int, extra: list[str], out: str) -> None:
    import torch.distributed as dist

    from fedml_moon.engine.data_parallel import DataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs)
    try:
        seconds, model = local_round(Path(out) / f"member-{rank}", extra, DataParallel(rank, procs))
        if rank == 0:
            torch.save({"seconds": seconds, "model": model}, os.path.join(out, "group.pt"))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--parties", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", default="fp32", help="fp32, or fp64 to see what is rounding")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from fedml_moon.conformance import free_port

    with tempfile.TemporaryDirectory() as tmp:
        extra = [f"train_args.epochs={args.epochs}", f"train_args.batch_size={args.batch}"]
        extra += [
            f"train_args.client_num_in_total={args.parties}",
            f"train_args.client_num_per_round={args.parties}",
        ]
        extra += [f"train_args.precision={args.precision}"]
        one, model = local_round(Path(tmp) / "one", extra)
        member_args = (args.procs, free_port(), extra, tmp)
        mp.spawn(_member, args=member_args, nprocs=args.procs, join=True)
        group = torch.load(os.path.join(tmp, "group.pt"), weights_only=True)
    gap = max(float((model[k].double() - group["model"][k].double()).abs().max()) for k in model)
    log.info(
        "one process: %.2f s; %d processes: %.2f s; trained models differ by %.3g",
        one,
        args.procs,
        group["seconds"],
        gap,
    )
    log.info("group_vs_one=%.3f", group["seconds"] / one)


if __name__ == "__main__":
    main()
