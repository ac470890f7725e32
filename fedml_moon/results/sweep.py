"""Sweeps: a base config, a grid of `--set` values, one output folder; every run of the grid as its
own `fedml-moon simulate` process.

A sweep file (YAML):

    base: ../paper/{dataset}_{algorithm}.yaml  # relative to the sweep file; {name}: the value of
    output: outputs/sweeps/table1              # the grid key or override whose last part is name
    set: {train_args.comm_round: 20}           # the same for every run
    grid:                                      # every combination, in this order
      dataset: [cifar10, cifar100]             # no dot: only names a value for `base`
      method:                                  # a mapping: several overrides at once
        - {train_args.algorithm: moon, algorithm_args.mu: 1}
        - {train_args.algorithm: fedavg}
      data_args.partition_alpha: [0.5, 0.1]    # a config key: one override
      common_args.random_seed: [0, 1, 2]
    slurm: {partition: gpu, time: "12:00:00", gpus_per_run: 1}   # for --on slurm (see cluster.py)

A run's folder is named by its grid values (`algorithm=moon,partition_alpha=0.5,random_seed=0`). A
run is complete when its `summary.json` says so; re-running the sweep skips complete runs and
continues a stopped one from its last checkpoint (`--resume`), so a crash or Ctrl-C costs only what
was not yet checkpointed; a run that failed before its first checkpoint starts again (`--overwrite`).
`commands()` are plain shell commands, one per run, for any job queue.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedml_moon.config.schema import ConfigError
from fedml_moon.records.folder import earlier_records
from fedml_moon.results.cluster import slurm_args
from fedml_moon.run_folder import OUTPUTS, SWEEPS, RunFolder, read_json

log = logging.getLogger(__name__)
SWEEP_KEYS = {"base", "output", "set", "grid", "slurm"}


@dataclass(frozen=True)
class Run:
    """One point of the grid: its folder, config file and overrides."""

    name: str
    folder: Path
    config: Path
    overrides: tuple[str, ...]

    def state(self) -> str:
        """complete (summary.json says completed), stopped (a checkpoint to go on from) or new."""
        folder = RunFolder(self.folder)
        if folder.summary.is_file():
            try:
                if read_json(folder.summary).get("status") == "completed":
                    return "complete"
            except (OSError, ValueError):
                pass
        return "stopped" if folder.checkpointed else "new"

    def argv(self, program: list[str], threads: int | None = None) -> list[str]:
        """The command that runs (or continues) this run."""
        sets = [*self.overrides] + ([f"device_args.torch_threads={threads}"] if threads else [])
        state = self.state()
        where = ["--resume", str(self.folder)] if state == "stopped" else ["--output-dir", str(self.folder)]
        if state == "new" and earlier_records(self.folder):  # a run that failed before a checkpoint
            where.append("--overwrite")
        return [
            *program,
            "simulate",
            "--cf",
            str(self.config),
            *(a for s in sets for a in ("--set", s)),
            *where,
        ]


def _override(key: str, value: Any) -> str:
    """`key=value` as `--set` parses it (YAML): strings as they are, the rest as JSON (true, 0.5, [1, 2])."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def _value_text(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return "".join(c if c.isalnum() or c in "._-+" else "_" for c in text)


def _config_path(base: str, sweep_dir: Path, names: dict[str, Any]) -> Path:
    for short, value in names.items():
        base = base.replace("{" + short + "}", str(value))
    path = Path(base)
    return path if path.is_absolute() else Path(os.path.normpath(sweep_dir / path))


def _point(values: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A grid point's folder name, its overrides and the names `base` may use. A grid key with a dot
    is a config key; a value that is a mapping sets several keys at once (a "method": an algorithm
    with its options); a key without a dot only names a value for `base` (e.g. {dataset})."""
    overrides: dict[str, Any] = {}
    names: dict[str, Any] = {}
    parts = []
    for key, value in values.items():
        short = key.rsplit(".", 1)[-1]
        if isinstance(value, dict):
            overrides.update(value)
            text = "_".join(f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in value.items())
        else:
            if "." in key:
                overrides[key] = value
            names[short] = value
            text = value
        parts.append(f"{short}={_value_text(text)}")
    names.update({k.rsplit(".", 1)[-1]: v for k, v in overrides.items()})
    return ",".join(parts) or "run", overrides, names


def read_sweep_file(path: Path) -> dict[str, Any]:
    """The sweep file's mapping."""
    if not path.is_file():
        raise ConfigError(f"sweep file {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep file {path}: must be a mapping (base, output, set, grid, slurm)")
    return raw


def load_sweep(
    path: str | Path,
    output: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    check: bool = True,
) -> list[Run]:
    """The sweep's runs, each config loaded once to check it (a bad key fails before anything runs).
    `overrides` (`--set` of the command line) apply to every run, after the file's `set`. `check`
    False (`--status`, which reads the runs' folders) skips loading the configs, and PyTorch with
    them; the sweep file itself is still checked."""
    path = Path(path)
    raw = read_sweep_file(path)
    unknown = set(raw) - SWEEP_KEYS
    if unknown or "base" not in raw or not isinstance(raw.get("grid", {}), dict):
        raise ConfigError(
            f"sweep file {path}: needs 'base' (a config; {{name}} takes a grid value), optional 'output', "
            f"'set', 'grid' (key: [values]) and 'slurm'; unknown: {', '.join(sorted(unknown)) or 'none'}"
        )
    slurm_args(raw.get("slurm"), {})  # a wrong resource fails before anything runs, as a wrong key
    grid: dict[str, list] = {k: v if isinstance(v, list) else [v] for k, v in (raw.get("grid") or {}).items()}
    grid_keys = {k for k in grid if "." in k} | {
        key for values in grid.values() for v in values if isinstance(v, dict) for key in v
    }
    clash = sorted(grid_keys & {item.split("=", 1)[0].strip() for item in overrides})
    if clash:
        raise ConfigError(
            f"--set {', '.join(clash)}: the sweep's grid sets it; change the sweep file instead"
        )
    fixed = [*(_override(k, v) for k, v in (raw.get("set") or {}).items()), *overrides]
    out = Path(output or raw.get("output") or Path(OUTPUTS, SWEEPS, path.stem))
    runs = []
    for combo in itertools.product(*grid.values()):
        name, values, names = _point(dict(zip(grid, combo, strict=True)))
        overrides = (*fixed, *(_override(k, v) for k, v in values.items()))
        config = _config_path(str(raw["base"]), path.parent, names)
        if check:
            _check(name, config, overrides)
        runs.append(Run(name, out / name, config, overrides))
    if len({r.name for r in runs}) != len(runs):
        raise ConfigError(
            f"sweep file {path}: two grid points give the same folder name; make the values distinct"
        )
    return runs


def _check(name: str, config: Path, overrides: tuple[str, ...]) -> None:
    """Load the run's config: a ConfigError names the run. (Imported here: a job that runs a Run,
    and `--status`, import no PyTorch.)"""
    from fedml_moon.config.load import load_config

    try:
        load_config(config, list(overrides))
    except ConfigError as err:
        raise ConfigError(f"sweep run {name}: {err}") from None


def commands(runs: list[Run]) -> list[str]:
    """One shell command per run (`fedml-moon simulate ...`), to run anywhere."""
    return [shlex.join(run.argv(["fedml-moon"])) for run in runs]


def threads_per_run(jobs: int) -> int | None:
    """PyTorch threads for each of `jobs` parallel runs (None: one run, `auto` decides)."""
    if jobs <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // jobs)


@dataclass
class Outcome:
    """What a sweep call did: runs found complete, runs it completed, runs that failed."""

    skipped: list[Run]
    completed: list[Run]
    failed: list[Run]


def _start(run: Run, program: list[str], threads: int | None) -> tuple[subprocess.Popen, Any]:
    run.folder.mkdir(parents=True, exist_ok=True)
    argv = run.argv(program, threads)
    logfile = RunFolder(run.folder).run_log.open("ab")
    logfile.write(f"$ {shlex.join(argv)}\n".encode())
    logfile.flush()
    # a session of its own: the sweep decides when its runs stop (they get SIGTERM and checkpoint)
    proc = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, logfile


def _stop(running: dict[Run, tuple[subprocess.Popen, Any]], grace_s: float = 30.0) -> None:
    """SIGTERM every run still going (each writes what it has), SIGKILL after `grace_s`."""
    for proc, _ in running.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc, logfile in running.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logfile.close()


def run_sweep(runs: list[Run], jobs: int = 1, poll_s: float = 0.5) -> Outcome:
    """Every run that is not complete, `jobs` at a time, each its own process with its log in
    `run.log`; one progress bar over runs. Interrupted (Ctrl-C, SIGTERM): the runs in flight stop
    cleanly and the exception goes on; calling again finishes what is missing."""
    from tqdm import tqdm

    skipped = [r for r in runs if r.state() == "complete"]
    todo = [r for r in runs if r not in skipped]
    program, threads = [sys.executable, "-m", "fedml_moon"], threads_per_run(jobs)
    running: dict[Run, tuple[subprocess.Popen, Any]] = {}
    outcome = Outcome(skipped, [], [])
    bar = tqdm(total=len(runs), initial=len(skipped), unit="run", desc="sweep", dynamic_ncols=True)
    try:
        while todo or running:
            while todo and len(running) < max(1, jobs):
                run = todo.pop(0)
                running[run] = _start(run, program, threads)
            time.sleep(poll_s)
            for run, (proc, logfile) in list(running.items()):
                if proc.poll() is None:
                    continue
                logfile.close()
                del running[run]
                ok = proc.returncode == 0 and run.state() == "complete"
                (outcome.completed if ok else outcome.failed).append(run)
                if not ok:
                    log.error(
                        "run %s failed (exit code %s); its log: %s",
                        run.name,
                        proc.returncode,
                        RunFolder(run.folder).run_log,
                    )
                bar.update(1)
    except BaseException:
        _stop(running)
        raise
    finally:
        bar.close()
    return outcome
