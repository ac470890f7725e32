"""Resume a stopped standalone run in a fresh process, as `fedml-moon simulate --resume DIR` does,
and save what its server and party algorithm objects hold at the start of every round it runs.

    python -m fedml_moon.conformance.probe --cf CONFIG [--set K=V ...] --resume DIR --snapshots FILE

FILE gets {round: {"server": ..., "party": ...}} (`conformance.snapshot`), loadable with
`torch.load(FILE, weights_only=True)`. Used by `fedml-moon check`: a fresh process holds only what
the checkpoint gave it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from fedml_moon.conformance.inprocess import algorithm_objects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedml_moon.conformance.probe")
    parser.add_argument("--cf", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--resume", required=True, metavar="DIR")
    parser.add_argument("--snapshots", required=True, metavar="FILE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from fedml_moon.adapters.run import assemble
    from fedml_moon.config.load import load_config

    run = assemble(load_config(args.cf, args.overrides), Path(args.resume), resume=True)
    server, seen = run.loop.server, {}
    downloads = server.downloads

    def watched(round_idx: int) -> dict:
        seen[round_idx] = algorithm_objects(run)
        return downloads(round_idx)

    server.downloads = watched
    run.loop.run()
    seen[len(run.loop.server.recorder.records)] = algorithm_objects(run)  # after the last round
    torch.save(seen, args.snapshots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
