"""Time one round of MOON and of FedAvg through the plugin against a bare PyTorch loop.

Setting: Fashion-MNIST, 10 parties, Dir(0.5), 1 local epoch, batch 64, simple CNN, evaluation of the
global model on the full test set included in both. The bare loop does the same arithmetic over the
same samples in the same process (same party index sets, same batch size, teachers for MOON, the same
weighted average, the same evaluation), with tensors pre-materialised and no framework around it.
Each measurement times round 1 (round 0 has no previous model for MOON) and the median of `--repeats`
alternating plugin/bare pairs is reported. Last line:
    moon_round_vs_bare=<ratio> fedavg_round_vs_bare=<ratio>
    moon_batched_vs_bare=<ratio> fedavg_batched_vs_bare=<ratio>   (on one line)
The batched columns time the same round with train_args.parties_in_parallel: 10 (all parties
stacked, one vmapped step per batch) against the same bare sequential loop.

Run: .venv/bin/python benchmarks/round_time.py [--repeats 3] [--threads N]
(--threads sets device_args.torch_threads; default: the config's, auto)
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedml_moon.adapters.run import Assembled, assemble
from fedml_moon.config.load import load_config
from fedml_moon.core.aggregation import weighted_average
from fedml_moon.core.losses import model_contrastive_loss

log = logging.getLogger("round_time")
CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"


def plugin_round(run: Assembled, round_idx: int) -> float:
    class _Bar:
        def set_postfix_str(self, _: str) -> None:
            pass

    started = time.perf_counter()
    run.loop.one_round(round_idx, _Bar())
    return time.perf_counter() - started


def _bare_party(model, teachers, x_all, y_all, idx, algo, mu, tau, gen) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    perm = idx[torch.randperm(len(idx), generator=gen)]
    for start in range(0, len(perm) - 63, 64):
        b = perm[start : start + 64]
        x, y = x_all[b], y_all[b]
        opt.zero_grad()
        _, z, logits = model(x)
        loss = F.cross_entropy(logits, y)
        if algo == "moon":
            with torch.no_grad():
                zg = teachers[0](x)[1]
                zp = [t(x)[1] for t in teachers[1:]]
            loss = loss + mu * model_contrastive_loss(z, zg, zp, tau)
        loss.backward()
        opt.step()
    return copy.deepcopy(model.state_dict())


@torch.no_grad()
def _bare_eval(model, x, y) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(y), 256):
        correct += int((model(x[start : start + 256])[2].argmax(1) == y[start : start + 256]).sum())
    model.train()
    return correct / len(y)


def bare_round(run: Assembled, algo: str, global_state: dict, prev_states: list[dict], gen) -> float:
    """The same round with plain tensors: train every party, average, evaluate."""
    data = run.fed.data
    x_all = data.x_train.float().div_(255)
    y_all = data.y_train
    x_test, y_test = data.x_test.float().div_(255), data.y_test
    opts = run.cfg.algorithm_args
    started = time.perf_counter()
    model, states = copy.deepcopy(run.model), []
    teachers = [copy.deepcopy(run.model).eval() for _ in range(2)]
    for party, idx in enumerate(run.fed.train_parts):
        model.load_state_dict(global_state)
        if algo == "moon":
            teachers[0].load_state_dict(global_state)
            teachers[1].load_state_dict(prev_states[party])
        mu, tau = getattr(opts, "mu", 0.0), getattr(opts, "temperature", 0.5)
        states.append(_bare_party(model, teachers, x_all, y_all, torch.as_tensor(idx), algo, mu, tau, gen))
    model.load_state_dict(weighted_average(states, [len(i) for i in run.fed.train_parts]))
    _bare_eval(model, x_test, y_test)
    return time.perf_counter() - started


def _assembled(algo: str, out: Path, threads: int | None, parallel: int) -> Assembled:
    overrides = ["train_args.epochs=1", "train_args.comm_round=2", "tracking_args.enable_wandb=false"]
    overrides.append(f"train_args.parties_in_parallel={parallel}")
    if threads:
        overrides.append(f"device_args.torch_threads={threads}")
    run = assemble(load_config(CONFIGS / f"{algo}.yaml", overrides), out / f"{algo}-k{parallel}")
    plugin_round(run, 0)  # warm-up; gives every MOON party its previous model
    return run


def measure(algo: str, repeats: int, out: Path, threads: int | None = None) -> tuple[float, float]:
    """Median ratios (sequential plugin round / bare round, batched plugin round / bare round)."""
    run, batched = _assembled(algo, out, threads, 1), _assembled(algo, out, threads, 10)
    global_state = copy.deepcopy(run.loop.aggregator.global_state)
    prev = [run.loop.trainer.store.get(p).get("pool", [global_state])[-1] for p in range(10)]
    gen = torch.Generator().manual_seed(0)
    ratios, batched_ratios = [], []
    for _ in range(repeats):
        run.loop.aggregator.set_model_params(global_state)
        t_plugin = plugin_round(run, 1)
        batched.loop.aggregator.set_model_params(global_state)
        t_batched = plugin_round(batched, 1)
        t_bare = bare_round(run, algo, global_state, prev, gen)
        ratios.append(t_plugin / t_bare)
        batched_ratios.append(t_batched / t_bare)
        log.info(
            "%s: plugin round %.2f s, batched (K=10) %.2f s, bare round %.2f s; ratios %.3f, %.3f",
            algo,
            t_plugin,
            t_batched,
            t_bare,
            ratios[-1],
            batched_ratios[-1],
        )
    return statistics.median(ratios), statistics.median(batched_ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        moon, moon_b = measure("moon", opts.repeats, Path(tmp), opts.threads)
        fedavg, fedavg_b = measure("fedavg", opts.repeats, Path(tmp), opts.threads)
    print(  # noqa: T201 (the script's output)
        f"moon_round_vs_bare={moon:.3f} fedavg_round_vs_bare={fedavg:.3f} "
        f"moon_batched_vs_bare={moon_b:.3f} fedavg_batched_vs_bare={fedavg_b:.3f}"
    )


if __name__ == "__main__":
    main()
