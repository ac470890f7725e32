"""How far stacked and sequential parties drift apart from rounding alone, in float32 and float64.

A correct algorithm with many kinks (tests/support/kit_plugins.py's `hinge`: the multi-class hinge loss on
the logits plus a ReLU margin on the projection's norm) is trained twice on the conformance suite's
tiny data (3 parties, all sampled; `--rounds` rounds of `--epochs` local epochs): its parties one after
another (`parties_in_parallel: 1`) and all three stacked (`parties_in_parallel: 3`), in float32 and in
float64 (`train_args.precision`). Both paths compute the same arithmetic; where a pre-activation lies
within rounding of a kink, it can fall one way in one path and the other way in the other, and the
gap then grows round after round. Printed: the largest difference of the two final models in each
precision, and their ratio. Why `fedml-moon check` compares stacked with sequential parties over
rounds in float64 only (docs: tutorials/write-algorithm.md).

Run: .venv/bin/python benchmarks/stacked_rounding.py [--rounds 10] [--epochs 2]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from fedml_moon.conformance import TINY
from fedml_moon.conformance.paths import _uploads_by_round

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
PLUGIN = ROOT / "tests" / "support" / "kit_plugins.py"
log = logging.getLogger("stacked_rounding")


def final_gap(overrides: list[str], folder: Path) -> float:
    """The largest |difference| of the final models, parties one after another vs three stacked."""
    finals = []
    for k in (1, 3):
        _, final = _uploads_by_round(
            CONFIG, [*overrides, f"train_args.parties_in_parallel={k}"], folder / str(k), []
        )
        finals.append(final)
    return max(float((finals[0][n].double() - finals[1][n].double()).abs().max()) for n in finals[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overrides = [*TINY, f"common_args.plugins=[{PLUGIN}:hinge]", "train_args.algorithm=hinge_kinks"]
    overrides += [f"train_args.comm_round={args.rounds}", f"train_args.epochs={args.epochs}"]
    overrides += ["train_args.client_num_per_round=3", "device_args.torch_threads=1"]
    with tempfile.TemporaryDirectory() as tmp:
        gaps = {
            p: final_gap([*overrides, f"train_args.precision={p}"], Path(tmp) / p) for p in ("fp32", "fp64")
        }
    for precision, gap in gaps.items():
        log.info("%s: stacked vs sequential final models differ by %.3g", precision, gap)
    log.info(
        "fp32_gap=%.3g fp64_gap=%.3g ratio=%.3g",
        gaps["fp32"],
        gaps["fp64"],
        gaps["fp32"] / max(gaps["fp64"], 1e-300),
    )


if __name__ == "__main__":
    main()
