"""A sweep's jobs: what was submitted for which run (the sweep folder's `jobs.json`), what the
scheduler says of them, and each run's state.

`jobs.json` is written whole and atomically (a file beside it, then a rename), under a lock that
one submitting process holds at a time. A submission is recorded before it is made, as a batch
with its runs and no job id, and its job ids after: a submitting process killed between the two
leaves a batch that the next one finds on the scheduler by its job name (Slurm) or its folder (a
local job's controller process), so a queued job is neither submitted twice nor lost.

A run's state, in the order it is decided:
    complete  its summary.json says so (whatever its job does)
    queued    its job waits (Slurm: PENDING, REQUEUED, ...)
    running   its job runs
    failed    it has a job that ended (or that the scheduler no longer knows) and it is not complete;
              a job that stopped its run to requeue counts as queued until submitit writes its
              result (out of requeues) or for REQUEUE_S at most
    stopped   never submitted, with a checkpoint to go on from (e.g. a local sweep stopped)
    new       never submitted
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedml_moon.errors import SchedulerError  # noqa: F401 (raised here, caught by the command line)
from fedml_moon.records.folder import held, in_progress
from fedml_moon.results.sweep import Run
from fedml_moon.run_folder import JOBS_LOCK, RunFolder, read_json, read_records, write_json

WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY"}
ENDED |= {"PREEMPTED", "TIMEOUT", "REVOKED"}
"""Slurm's states of a job that will not run again; any other (RUNNING, STOPPED, SUSPENDED, ...,
and a state this list does not know) counts as running, so its run is never submitted twice."""
SUBMITTABLE = ("new", "stopped", "failed")


class SweepBusy(SchedulerError):
    """Another process is submitting this sweep's runs."""


def locked(folder: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the sweep folder's submission lock (released by the kernel if the holder dies)."""
    busy = SweepBusy(
        f"another `fedml-moon sweep` is submitting the runs of {folder}; let it finish (or stop it) "
        "and run this again"
    )
    return held(folder / JOBS_LOCK, busy)


def read(folder: Path) -> dict[str, Any]:
    """The sweep's record: {"batches": {id: {...}}, "runs": {name: {"job", "batch", ...}}}."""
    path = RunFolder(folder).jobs
    if not path.is_file():
        return {"batches": {}, "runs": {}}
    try:
        record = read_json(path)
        if isinstance(record.get("batches"), dict) and isinstance(record.get("runs"), dict):
            return record
    except (ValueError, AttributeError):
        pass
    raise SchedulerError(
        f"{path} is not a sweep's job record (it lists the jobs submitted); put back the file as "
        "written, or remove it: every run not complete then counts as not submitted"
    )


def write(folder: Path, record: dict[str, Any]) -> None:
    """Replace the record at once: a reader sees the old one or the new one, never a part."""
    write_json(RunFolder(folder).jobs, record, indent=1, sort_keys=True)


@dataclass(frozen=True)
class Job:
    """What the scheduler says of one job: queued, running or ended, and its own word for it."""

    phase: str
    word: str


Known = dict[str, tuple[str, Job]]
"""What the schedulers know: job id -> (its job name, or a local job's folder; the job)."""


def slurm_jobs() -> Known:
    """This user's jobs Slurm still knows (ended ones for a few minutes): id -> (name, job)."""
    user = pwd.getpwuid(os.getuid()).pw_name  # the real user, whatever USER or LOGNAME say
    argv = ["squeue", "-u", user, "-t", "all", "-h", "-r", "-o", "%i|%j|%T|%r"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SchedulerError(f"squeue could not tell the jobs' states ({err}); is Slurm reachable?") from None
    if done.returncode != 0:
        raise SchedulerError(f"squeue could not tell the jobs' states: {done.stderr.strip()}")
    return parse_squeue(done.stdout)


def parse_squeue(text: str) -> Known:
    """squeue's `%i|%j|%T|%r` lines: job id -> (name, job). An id listed twice (a requeued array
    task: its ended start and the one that waits) counts as its live entry."""
    out: Known = {}
    for line in text.splitlines():
        job_id, name, state, reason = (line.split("|") + ["", "", ""])[:4]
        phase = "queued" if state in WAITING else "ended" if state in ENDED else "running"
        word = state if reason in ("", "None") or phase != "queued" else f"{state} ({reason})"
        seen = out.get(job_id.strip())
        if seen is None or seen[1].phase == "ended":
            out[job_id.strip()] = (name, Job(phase, word))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def local_jobs(folders: list[str]) -> Known:
    """The local executor's job controllers alive on this machine for these submission folders:
    job id (the controller's pid) -> (folder, job)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        line = _cmdline(int(entry.name))
        if "submitit.local._local" not in line:
            continue
        for folder in folders:
            if line.rstrip().endswith(folder):
                out[entry.name] = (folder, Job("running", "RUNNING"))
    return out


def scheduler(record: dict[str, Any]) -> Known:
    """What the schedulers the sweep has used say of this user's jobs (keyed by job id)."""
    batches = record["batches"].values()
    known = slurm_jobs() if any(b["on"] == "slurm" for b in batches) else {}
    return {**known, **local_jobs([b["folder"] for b in batches if b["on"] == "local"])}


def _task(job_id: str) -> int:
    """The array task index of a Slurm job id (`12_3` -> 3); 0 for a job that is not an array."""
    return int(job_id.rsplit("_", 1)[1]) if "_" in job_id else 0


def submitting(folder: str) -> bool:
    """Whether an sbatch of the submission in `folder` still runs on this machine (a submitting
    process killed while sbatch ran leaves it running: its jobs may appear in a moment)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            words = _cmdline(int(entry.name)).split()
            if any(Path(w).name == "sbatch" for w in words[:2]) and folder in " ".join(words):
                return True
    return False


def reconcile(record: dict[str, Any], known: Known) -> tuple[bool, dict[str, list[str]]]:
    """Give the job ids of a batch recorded without them (its submitter died before writing them):
    each run the job the scheduler knows under the batch's name (Slurm) or folder (local) and task
    index, if submitit gave that job its task (its pickle is there); a job without one cannot run
    and is returned to be cancelled. A run with no such job is left unsubmitted (it never was, or its
    job ended: its own folder says the rest), unless the batch's sbatch still runs: then the batch
    waits, its runs counted as queued. Returns whether the record changed, and the jobs to cancel
    by executor."""
    changed, cancel = False, {}
    for batch_id, batch in list(record["batches"].items()):
        if batch.get("jobs") is not None:
            continue
        key = batch["name"] if batch["on"] == "slurm" else batch["folder"]
        found = {_task(job_id): job_id for job_id, (name, _) in known.items() if name == key}
        if not found and batch["on"] == "slurm" and submitting(batch["folder"]):
            continue
        changed = True
        handless = [j for j in found.values() if not (Path(batch["folder"]) / f"{j}_submitted.pkl").is_file()]
        if handless:
            cancel.setdefault(batch["on"], []).extend(handless)
        jobs = [found.get(i) if found.get(i) not in handless else None for i in range(len(batch["runs"]))]
        for name, job_id in zip(batch["runs"], jobs, strict=True):
            if job_id is None and record["runs"].get(name, {}).get("batch") == batch_id:
                del record["runs"][name]
        if any(jobs):
            assign(record, batch_id, jobs)
        else:
            del record["batches"][batch_id]
    return changed, cancel


def cancel(on: str, job_ids: list[str]) -> None:
    """Cancel jobs of this sweep that cannot run (Slurm: scancel; local: the controller's SIGINT)."""
    if on == "slurm":
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=60)
        return
    for job_id in job_ids:
        try:
            os.kill(int(job_id), signal.SIGINT)
        except (ProcessLookupError, ValueError):
            pass


def assign(record: dict[str, Any], batch_id: str, job_ids: list[str | None]) -> None:
    """Record a batch's job ids, one per run in the batch's order (None: that run has none)."""
    batch = record["batches"][batch_id]
    batch["jobs"] = list(job_ids)
    for name, job_id in zip(batch["runs"], job_ids, strict=True):
        if job_id is not None:
            record["runs"][name] = {"job": job_id, "batch": batch_id, "on": batch["on"], "at": batch["at"]}


def begin(record: dict[str, Any], batch_id: str, on: str, runs: list[Run], name: str, folder: Path) -> None:
    """Record a submission about to be made: its runs, its job name and folder, no job ids yet."""
    record["batches"][batch_id] = {
        "on": on,
        "name": name,
        "folder": str(folder),
        "runs": [r.name for r in runs],
        "jobs": None,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    for run in runs:
        record["runs"][run.name] = {"job": None, "batch": batch_id, "on": on}


@dataclass(frozen=True)
class RunState:
    """A run's state (see the module's docstring), its job id and a line saying more."""

    state: str
    job: str | None
    detail: str


def last_line(run: Run, job_output: Path | None = None) -> str:
    """The last line the run wrote (its run.log, else its job's output: a job that failed before
    the run started), for a failed run's status."""
    folder = RunFolder(run.folder)
    for path in (folder.run_log, folder.job_output, job_output):
        try:
            lines = path.read_text(errors="replace").splitlines() if path else []
        except OSError:
            continue
        text = next((line.strip() for line in reversed(lines) if line.strip()), "")
        if text:
            return text if len(text) <= 300 else text[:297] + "..."
    return "no log written"


def _progress(run: Run) -> str:
    if not RunFolder(run.folder).metrics.is_file():
        return ""
    rounds = len(read_records(run.folder))
    return f"{rounds} round{'s' * (rounds != 1)} recorded"


def _own_word(run: Run) -> str:
    """What the run's job wrote of its end (`job.json`), when the scheduler no longer says."""
    try:
        own = read_json(RunFolder(run.folder).job)
    except (OSError, ValueError):
        return "ended before it started the run"
    if own.get("state") == "running":
        return "its job ended before it could write how (cancelled, killed, or its node failed)"
    if own.get("state") == "requeued":
        return "out of time more often than slurm.timeouts_requeued allows (raise it, or slurm.time)"
    return f"{own.get('state', 'ended')}, exit code {own.get('exit_code')}"


def state_of(run: Run, record: dict[str, Any], known: Known) -> RunState:
    """The run's state from its folder, the sweep's record and what the scheduler knows."""
    own, entry = run.state(), record["runs"].get(run.name) or {}
    job_id = entry.get("job")
    if own == "complete":
        return RunState("complete", job_id, _progress(run))
    if entry and job_id is None:  # reconcile() left it: its sbatch still runs
        return RunState("queued", None, "being submitted (its sbatch still runs)")
    job = known.get(job_id, ("", None))[1] if job_id else None
    if job is not None and job.phase in ("queued", "running"):
        detail = job.word if job.phase == "queued" else ", ".join(filter(None, [job.word, _progress(run)]))
        return RunState(job.phase, job_id, detail)
    if in_progress(run.folder):  # a process runs it still (a sweep's or a job's that lost its parent)
        return RunState("running", job_id, ", ".join(filter(None, ["a process runs it", _progress(run)])))
    if job_id is None:
        return RunState(own, None, _progress(run) if own == "stopped" else "")
    batch = record["batches"].get(entry.get("batch"), {})
    folder = Path(batch["folder"]) if batch.get("folder") else None
    if _requeued(run) and _being_requeued(run, folder, job_id):
        return RunState("queued", job_id, "being requeued")
    output = folder / f"{job_id}_0_log.out" if folder else None
    word = _own_word(run) if job is None or _requeued(run) else job.word
    return RunState("failed", job_id, f"{word}: {last_line(run, output)}")


REQUEUE_S = 60.0
"""How long a job that stopped its run to requeue may be out of the scheduler's queue (or in an
ended state: Slurm passes through one as it requeues a job) before it counts as failed."""


def _requeued(run: Run) -> bool:
    """Whether the run's job last stopped it to requeue (so it ended out of requeues)."""
    try:
        return read_json(RunFolder(run.folder).job).get("state") == "requeued"
    except (OSError, ValueError):
        return False


def _being_requeued(run: Run, folder: Path | None, job_id: str) -> bool:
    """Whether a job that stopped its run to requeue is still between its two starts: submitit wrote
    no result for it (it writes one when it does not requeue: out of requeues), and it stopped the
    run less than REQUEUE_S ago (a requeued job cancelled before it starts again has no result
    either)."""
    if folder is None or (folder / f"{job_id}_0_result.pkl").exists():
        return False
    try:
        return time.time() - RunFolder(run.folder).job.stat().st_mtime < REQUEUE_S
    except OSError:
        return False
