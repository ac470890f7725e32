"""A sweep's resources on a cluster: the `slurm:` section of a sweep file (or the command line's
`--partition`, `--time`, ...), checked when the sweep is read, and the submitit executor they make.

    slurm:
      partition: gpu
      account: my-lab
      time: "12:00:00"            # per run: minutes, HH:MM:SS or D-HH:MM:SS
      gpus_per_run: 1
      cpus_per_run: 8
      mem_gb: 32
      setup: ["source .venv/bin/activate"]
      sbatch: ["--constraint=a100"]

A job that reaches its time limit gets SIGUSR2 `signal_delay_s` before it: the run stops (its last
checkpoint is kept) and the job requeues itself, to go on from that checkpoint (submitit's
checkpointing), up to `timeouts_requeued` times.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedml_moon.errors import ConfigError, require

SECTION = "slurm"
_SWEEP_SETS = "the sweep sets it (its jobs are found, logged and signalled by it)"
OWN_OPTIONS = {
    **dict.fromkeys(("job-name", "array", "output", "error", "open-mode", "signal"), _SWEEP_SETS),
    **dict.fromkeys(("parsable", "wrap", "no-requeue"), _SWEEP_SETS),
    "partition": "give it as slurm.partition (or --partition)",
    "account": "give it as slurm.account (or --account)",
    "qos": "give it as slurm.qos (or --qos)",
    "time": "give it as slurm.time (or --time): the run's requeue at its limit depends on it",
    "cpus-per-task": "give it as slurm.cpus_per_run (or --cpus)",
    "gpus-per-node": "give it as slurm.gpus_per_run (or --gpus)",
    "mem": "give it as slurm.mem_gb (or --mem)",
}
"""#SBATCH options a sweep file's `sbatch:` may not give, and why."""
EXECUTORS = ("local", "slurm")
_TIME = re.compile(r"(?:(?P<d>\d+)-)?(?P<h>\d+):(?P<m>\d{1,2})(?::(?P<s>\d{1,2}))?")


@dataclass
class SlurmArgs:
    """A sweep's Slurm resources, the same for every run of the grid (one array job per submission)."""

    partition: str | None = None
    """the partition (queue) every run is submitted to; null: the cluster's default"""
    account: str | None = None
    """the account the runs are charged to; null: your default account"""
    qos: str | None = None
    """the quality of service (--qos); null: the partition's default"""
    time: int | str = "24:00:00"
    """time limit of one run's job: minutes, HH:MM:SS or D-HH:MM:SS; a run that needs longer requeues"""
    gpus_per_run: int = 0
    """GPUs of each run (--gpus-per-node); 0: none (the run trains on the CPU)"""
    cpus_per_run: int | None = None
    """CPU cores of each run (--cpus-per-task), also the run's PyTorch threads; null: the cluster's default"""
    mem_gb: float | None = None
    """memory of each run in GB (--mem); null: the cluster's default"""
    runs_at_a_time: int | None = None
    """the most runs of one submission running at once (the job array's %N); null: as the cluster allows"""
    setup: list[str] = field(default_factory=list)
    """shell lines run before each run, e.g. [module load cuda, source .venv/bin/activate]"""
    sbatch: list[str] = field(default_factory=list)
    """more #SBATCH options, each written as on sbatch's command line, e.g. [--constraint=a100]"""
    signal_delay_s: int = 120
    """seconds before the time limit at which a run stops and requeues itself; >= 10"""
    timeouts_requeued: int = 3
    """how many times a run that reached its time limit is requeued to go on; >= 0"""

    def check(self) -> None:
        minutes(self.time)
        require(self.gpus_per_run >= 0, "slurm.gpus_per_run", "must be >= 0")
        for key in ("cpus_per_run", "runs_at_a_time"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"slurm.{key}", "must be >= 1 (or null)")
        require(self.mem_gb is None or self.mem_gb > 0, "slurm.mem_gb", "must be > 0 (or null)")
        require(self.signal_delay_s >= 10, "slurm.signal_delay_s", "must be >= 10 seconds")
        require(
            self.signal_delay_s * 2 <= minutes(self.time) * 60,
            "slurm.signal_delay_s",
            f"{self.signal_delay_s} s is more than half the time limit ({self.time!r}); "
            "lower it or raise slurm.time",
        )
        require(self.timeouts_requeued >= 0, "slurm.timeouts_requeued", "must be >= 0")
        sbatch_options(self.sbatch)


def minutes(value: int | str) -> int:
    """A Slurm time limit in whole minutes (rounded up): 90, "1:30:00", "2-00:00:00"."""
    if isinstance(value, int) and not isinstance(value, bool):
        require(value >= 1, "slurm.time", f"must be >= 1 minute; got {value}")
        return value
    text = str(value).strip()
    match = _TIME.fullmatch(text)
    if text.isdigit():
        return minutes(int(text))
    require(match is not None, "slurm.time", f"write minutes, HH:MM:SS or D-HH:MM:SS; got {value!r}")
    d, h, m, s = (int(match.group(k) or 0) for k in "dhms")
    total = d * 1440 + h * 60 + m + (1 if s else 0)
    require(total >= 1, "slurm.time", f"must be at least one minute; got {value!r}")
    return total


def sbatch_options(lines: list[str]) -> dict[str, Any]:
    """`["--constraint=a100", "--exclusive"]` as submitit's additional_parameters; an option the
    sweep sets itself (the job's name, array, output, signal, or a key of this section) refused."""
    out: dict[str, Any] = {}
    for line in lines:
        text = line.strip().removeprefix("#SBATCH").strip()
        require(
            text.startswith("--") and len(text) > 2 and " " not in text.split("=", 1)[0],
            "slurm.sbatch",
            f"write each option in its long form, e.g. --constraint=a100 or --exclusive; got {line!r}",
        )
        key, _, value = text[2:].partition("=")
        own = OWN_OPTIONS.get(key)
        require(own is None, "slurm.sbatch", f"{line!r}: {own}")
        out[key.replace("-", "_")] = value if value else True
    return out


def slurm_args(raw: dict[str, Any] | None, overrides: dict[str, Any]) -> SlurmArgs:
    """The sweep file's `slurm:` section with the command line's values on top (None: not given)."""
    merged = dict(raw or {})
    for key, value in overrides.items():
        if value is None or value == []:
            continue
        merged[key] = [*merged.get(key, []), *value] if key == "sbatch" else value
    from fedml_moon.config.fields import build_section

    return build_section(SlurmArgs, merged, SECTION)


def executor(on: str, folder: Path, args: SlurmArgs, name: str) -> Any:
    """submitit's executor for one submission: Slurm (an array job named `name`) or this machine."""
    import submitit

    common = {"signal_delay_s": args.signal_delay_s, "stderr_to_stdout": True}
    if on == "local":
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=args.timeouts_requeued)
        ex.update_parameters(timeout_min=minutes(args.time), setup=list(args.setup), **common)
        return ex
    if on != "slurm":
        raise ConfigError(f"--on {on}: choose one of {', '.join(EXECUTORS)}")
    try:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=args.timeouts_requeued)
    except RuntimeError as err:
        raise ConfigError(f"--on slurm: {err} (sbatch and srun must be on PATH)") from None
    given = {
        "partition": args.partition,
        "account": args.account,
        "qos": args.qos,
        "cpus_per_task": args.cpus_per_run,
        "gpus_per_node": args.gpus_per_run or None,
        "mem": f"{max(1, math.ceil(args.mem_gb * 1024))}MB" if args.mem_gb else None,
        "array_parallelism": args.runs_at_a_time,
        "setup": list(args.setup) or None,
    }
    ex.update_parameters(
        job_name=name,
        time=minutes(args.time),
        additional_parameters=sbatch_options(args.sbatch) or None,
        **{k: v for k, v in given.items() if v is not None},
        **common,
    )
    return ex
