"""Where the test suite's time goes, from the run `bash run/test.sh` just made.

`run/test.sh` (the whole suite) writes pytest's junit to outputs/suite/junit.xml and each test's
started processes (tests/conftest.py) to outputs/suite/processes/, then runs this script, which
prints: pytest's wall time against the budget (20 minutes on 2 cores), the slowest tests, each
file's share of the test time, and how many tests start a real process in each mode.

    .venv/bin/python benchmarks/suite_budget.py --top 20
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

import yaml

log = logging.getLogger("suite_budget")
ROOT = Path(__file__).resolve().parent.parent
MODES = ("standalone", "mpi-simulation", "cross-silo-mpi", "cross-silo-grpc", "mqtt-s3", "torchrun")


def mode_of(command: str) -> str | None:
    """The mode a started command runs in, or None when it is no run of the plugin."""
    words = command.split()
    if "fedml_moon" not in command and "fedml-moon" not in command and "run/" not in command:
        return None
    if "torchrun" in command:
        return "torchrun"
    simulate = "simulate" in words or "run/mpirun.sh" in command and " simulate " in command
    if "mpirun" in command:
        return "mpi-simulation" if simulate else "cross-silo-mpi"
    if simulate:
        return "standalone"
    if "run" in words or "run/run_server.sh" in command or "run/run_client.sh" in command:
        backend = _setting(words, "comm_args.backend")
        return {"GRPC": "cross-silo-grpc", "MQTT_S3": "mqtt-s3", "MPI": "cross-silo-mpi"}.get(backend or "")
    return None


def _setting(words: list[str], key: str) -> str | None:
    """`key` as the command's last --set gives it, else as the config file (--cf) gives it."""
    sets = [w.split("=", 1)[1] for w in words if w.startswith(key + "=")]
    if sets:
        return sets[-1]
    config = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--cf"), None)
    if config is None and any("run_server.sh" in w or "run_client.sh" in w for w in words):
        config = "config/modes/moon_cross_silo_grpc.yaml"
    path = Path(config) if config else None
    if path is not None and not path.is_absolute():
        path = ROOT / path
    if path is None or not path.is_file():
        return None
    section, name = key.split(".")
    return ((yaml.safe_load(path.read_text()) or {}).get(section) or {}).get(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", default="outputs/suite/junit.xml")
    parser.add_argument("--processes", default="outputs/suite/processes")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    parser.add_argument("--budget-min", type=float, default=20.0, help="the suite's budget in minutes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    suite = ET.parse(args.junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests = [
        (float(c.get("time", 0)), f"{c.get('classname')}::{c.get('name')}") for c in suite.iter("testcase")
    ]
    wall = float(suite.get("time", 0))
    log.info(
        "pytest: %d tests, %.1f minutes (budget %.0f: %.2f of it)",
        len(tests),
        wall / 60,
        args.budget_min,
        wall / 60 / args.budget_min,
    )
    log.info("slowest %d:", args.top)
    for seconds, name in sorted(tests, reverse=True)[: args.top]:
        log.info("  %7.1f s  %s", seconds, name)
    shares, total = Counter(), sum(s for s, _ in tests) or 1.0
    for seconds, name in tests:
        shares[name.split("::")[0]] += seconds
    log.info("each file's share of %.0f test-seconds:", total)
    for name, seconds in shares.most_common():
        if seconds >= 0.005 * total:
            log.info("  %5.1f %%  %7.1f s  %s", 100 * seconds / total, seconds, name)
    by_mode: dict[str, set[str]] = defaultdict(set)
    starting: set[str] = set()
    for path in sorted(Path(args.processes).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            starting.add(record["test"])
            for command in record["started"]:
                mode = mode_of(re.sub(r"^\S+ ", "", command))
                if mode:
                    by_mode[mode].add(record["test"])
    counts = " ".join(f"{m}={len(by_mode[m])}" for m in MODES)
    log.info(
        "tests that start processes: %d; of them, starting the plugin's command line in each mode: %s",
        len(starting),
        counts,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
