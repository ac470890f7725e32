"""`fedml-moon replay RUN_DIR`: a buffered run (`server_args.aggregation: buffered`) replayed from its
records in the standalone simulation (`engine.replay`), its records, summary and final model written
to `--output-dir` (default RUN_DIR/replay), and its final model compared with the run's: exit 0 when
no tensor differs by more than `--atol`, 1 otherwise or when the replay diverged from the records."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from fedml_moon.errors import ConfigError
from fedml_moon.run_folder import FINAL_MODEL, RunFolder, read_json, read_records

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="a buffered run's folder (metrics.jsonl, summary.json)"
    )
    parser.add_argument("--output-dir", help="where the replayed run's records go (default: RUN_DIR/replay)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier replay's records in the output directory"
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=1e-5,
        help="the largest difference of a model tensor from the run's that passes (default 1e-5: parties "
        "trained together rather than one by one differ by about that in float32)",
    )


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's summary and records; a ConfigError where it is not a buffered run with records."""
    summary_path = RunFolder(run_dir).summary
    if not summary_path.is_file():
        raise ConfigError(
            f"{run_dir}: not a run folder (no summary.json); name a buffered run's output folder"
        )
    summary = read_json(summary_path)
    server = (summary.get("config") or {}).get("server_args") or {}
    if server.get("aggregation") != "buffered":
        raise ConfigError(
            f"{run_dir}: server_args.aggregation is {server.get('aggregation', 'sync')!r}, not buffered; "
            "only a buffered run's records say which update went into which buffer"
        )
    records = read_records(run_dir)
    if not records:
        raise ConfigError(f"{run_dir}: no records (metrics.jsonl is missing or empty): nothing to replay")
    return summary, records


def model_difference(replayed: dict, recorded: dict) -> tuple[float, str]:
    """The largest absolute difference between two state dicts, and the tensor it is in."""
    if set(replayed) != set(recorded):
        raise ConfigError(
            f"the run's model holds tensors {sorted(set(recorded) ^ set(replayed))} the replayed one does "
            "not (or the other way): another network"
        )
    far = {k: float((replayed[k].double() - recorded[k].double()).abs().max()) for k in recorded}
    name = max(far, key=far.get)
    return far[name], name


def standalone(raw: dict[str, Any]) -> dict[str, Any]:
    """The run's config (its summary's) as the standalone simulation's: a distributed run's records
    replay in one process (the mode decides who trains, not what)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    out.setdefault("common_args", {}).update(training_type="simulation", scenario="horizontal")
    out.setdefault("comm_args", {})["backend"] = "sp"
    return out


def replay_run(summary: dict[str, Any], records: list[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """Rebuild the run from its config and replay its records into `out_dir`; returns the summary."""
    from fedml_moon.adapters import compat
    from fedml_moon.adapters.run import build_base, build_runner, build_server
    from fedml_moon.config.load import config_from_dict, load_config_plugins
    from fedml_moon.engine.replay import ReplaySimulation

    run = summary["config"]
    if (run.get("common_args") or {}).get("training_type") == "cross_silo" and (
        (run.get("data_args") or {}).get("partition_method") == "natural"
    ):
        raise ConfigError(
            "data_args.partition_method: the run trained on the sites' own data (natural), which the "
            "server never held; a replay needs every party's data in one process"
        )
    raw = standalone(run)
    load_config_plugins(raw, Path.cwd())
    cfg = config_from_dict(raw)
    base = build_base(cfg, out_dir)
    loop = ReplaySimulation(build_server(base), build_runner(base), cfg, records)
    compat.run_flow(loop, base.folder.fedml_home, base.args, base.device, base.dataset, base.model)
    return loop.summary


def run(args: argparse.Namespace) -> int:
    """Replay, then compare the final models (module docstring)."""
    import torch

    from fedml_moon.engine.replay import ReplayDiverged
    from fedml_moon.records.folder import claim_folder, running

    if not args.atol >= 0:
        raise ConfigError(f"--atol {args.atol}: give a difference >= 0, e.g. --atol 1e-5")
    run_dir = Path(args.run_dir)
    summary, records = read_run(run_dir)
    model_path = run_dir / summary.get("model_file", FINAL_MODEL)
    if not model_path.is_file():
        raise ConfigError(f"{model_path}: the run's model is gone; nothing to compare the replay with")
    out_dir = Path(args.output_dir) if args.output_dir else RunFolder(run_dir).replay
    try:
        with running(out_dir):
            claim_folder(out_dir, args.overwrite, resumable=False)  # a replay has no --resume
            replay_run(summary, records, out_dir)
    except ReplayDiverged as err:
        log.error("%s", err)
        return 1
    replayed = torch.load(RunFolder(out_dir).final_model, weights_only=True)
    far, name = model_difference(replayed, torch.load(model_path, weights_only=True))
    same = far <= args.atol
    verdict = "the same model" if same else "another model"
    line = (
        f"replayed {len(records)} rounds into {out_dir}: the final model's largest difference from "
        f"{model_path} is {far:.3g} (in {name}); --atol {args.atol:g}: {verdict}"
    )
    (log.info if same else log.error)("%s", line)
    sys.stdout.write(line + "\n")
    return 0 if same else 1
