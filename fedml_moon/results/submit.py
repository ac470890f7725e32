"""A sweep through a job scheduler (`fedml-moon sweep FILE --on slurm|local`): every run that is not
complete, queued or running is submitted through submitit, as one Slurm array job or as local jobs
`jobs` at a time; `--status` prints each run's state; `--wait` (always, for local jobs) follows
them to the end.

The sweep folder is the one a local sweep writes (a run folder per grid point, `fedml-moon report`
reads it unchanged), with `jobs.json` (see `jobs`) and submitit's files under `.submitit/`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from fedml_moon.errors import ConfigError
from fedml_moon.results import jobs
from fedml_moon.results.cluster import SlurmArgs, executor
from fedml_moon.results.jobs import Known, RunState
from fedml_moon.results.sweep import Run, threads_per_run
from fedml_moon.results.sweep_job import SweepJob
from fedml_moon.run_folder import SUBMITIT, RunFolder

log = logging.getLogger(__name__)
ARRAY_SIZE = 1000  # runs of one array job
ORDER = ("complete", "running", "queued", "failed", "stopped", "new")


class SubmitError(jobs.SchedulerError):
    """The scheduler refused a submission; nothing of it was submitted."""


def absolute(runs: list[Run]) -> list[Run]:
    """The runs with absolute folders and configs: a job may start in another directory."""
    return [dataclasses.replace(r, folder=r.folder.resolve(), config=r.config.resolve()) for r in runs]


def states(runs: list[Run], folder: Path) -> dict[str, RunState]:
    """Every run's state now (the record's unresolved batches resolved in memory only)."""
    record = jobs.read(folder)
    known = jobs.scheduler(record)
    jobs.reconcile(record, known)
    return _states(runs, record, known)


def _states(runs: list[Run], record: dict[str, Any], known: Known) -> dict[str, RunState]:
    return {r.name: jobs.state_of(r, record, known) for r in runs}


def _submit(
    folder: Path, record: dict[str, Any], on: str, runs: list[Run], args: SlurmArgs, threads: int | None
) -> None:
    """One submission: recorded before it is made (no job ids), then with its job ids."""
    batch = uuid.uuid4().hex[:12]
    name, where = f"fedml-moon-sweep-{batch}", folder / SUBMITIT / batch
    ex = executor(on, where, args, name)
    jobs.begin(record, batch, on, runs, name, where)
    jobs.write(folder, record)
    try:
        with ex.batch():
            grace = max(5.0, args.signal_delay_s - 10.0)  # stopped before Slurm kills it at the limit
            submitted = [ex.submit(SweepJob(run, batch, threads, grace)) for run in runs]
    except Exception as err:  # sbatch failed; it may have failed after Slurm took the jobs
        _resolve(folder, record)  # any job it left is cancelled: it never got its run
        raise SubmitError(
            f"the {on} scheduler refused the submission: {str(err).strip()} (nothing of it is left "
            "queued; submit again)"
        ) from None
    jobs.assign(record, batch, [str(job.job_id) for job in submitted])
    jobs.write(folder, record)
    log.info(
        "submitted %s to %s: %s", _plural(len(runs), "run"), on, _job_text(record["batches"][batch]["jobs"])
    )


def check_resumes(runs: list[Run]) -> None:
    """Refuse, before anything is submitted, a run that would go on from its checkpoint with
    another config (a changed `--set`, sweep file or base config): its job would fail at start."""
    from fedml_moon.config.load import load_config
    from fedml_moon.engine.resume import check_resumable

    for run in runs:
        if RunFolder(run.folder).checkpointed:
            try:
                check_resumable(run.folder, load_config(run.config, list(run.overrides)))
            except ConfigError as err:
                raise ConfigError(
                    f"sweep run {run.name} would go on from its checkpoint: {err}; or remove "
                    f"{run.folder} to start it over"
                ) from None


def _resolve(folder: Path, record: dict[str, Any] | None = None) -> tuple[dict[str, Any], Known]:
    """The record, its unresolved batches resolved on the scheduler and written back; and what the
    scheduler knows."""
    record = jobs.read(folder) if record is None else record
    known = jobs.scheduler(record)
    changed, cancel = jobs.reconcile(record, known)
    for on, job_ids in cancel.items():
        log.warning("cancelling job %s: its submitter died before handing it its run", ", ".join(job_ids))
        jobs.cancel(on, job_ids)
    if changed:
        jobs.write(folder, record)
    return record, known


def submit_slurm(runs: list[Run], folder: Path, args: SlurmArgs) -> int:
    """Submit every run that is new, stopped or failed as one array job; the number submitted."""
    with jobs.locked(folder):
        record, known = _resolve(folder)
        now = _states(runs, record, known)
        todo = [r for r in runs if now[r.name].state in jobs.SUBMITTABLE]
        check_resumes(todo)
        for start in range(0, len(todo), ARRAY_SIZE):  # Slurm's MaxArraySize is 1001 by default
            _submit(folder, record, "slurm", todo[start : start + ARRAY_SIZE], args, args.cpus_per_run)
        _summary(runs, now, todo)
        return len(todo)


def run_local(
    runs: list[Run], folder: Path, args: SlurmArgs, at_once: int, poll_s: float
) -> dict[str, RunState]:
    """Run every run that is not complete through submitit's local executor, `at_once` at a time
    (each its own job), and wait for all of them, those an earlier call left running included."""
    threads, tried = threads_per_run(at_once), set()
    with jobs.locked(folder):
        while True:
            record, known = _resolve(folder)
            now = _states(runs, record, known)
            busy = sum(s.state in ("queued", "running") for s in now.values())
            todo = [r for r in runs if now[r.name].state in jobs.SUBMITTABLE and r.name not in tried]
            check_resumes(todo)
            for run in todo[: max(0, max(1, at_once) - busy)]:
                _submit(folder, record, "local", [run], args, threads)
                tried.add(run.name)
            if not busy and not todo:
                return now
            time.sleep(poll_s)


def wait(runs: list[Run], folder: Path, poll_s: float) -> dict[str, RunState]:
    """Follow the runs until none is queued or running; their states then."""
    last = None
    while True:
        now = states(runs, folder)
        counts = _counts(now)
        if counts != last:
            log.info("sweep: %s", counts)
            last = counts
        if not any(s.state in ("queued", "running") for s in now.values()):
            return now
        time.sleep(poll_s)


def _counts(now: dict[str, RunState]) -> str:
    tally = Counter(s.state for s in now.values())
    return ", ".join(f"{tally[k]} {k}" for k in ORDER if tally[k])


def _summary(runs: list[Run], now: dict[str, RunState], todo: list[Run]) -> None:
    log.info("sweep: %s: %s; %d submitted now", _plural(len(runs), "run"), _counts(now), len(todo))


def _job_text(ids: list[str]) -> str:
    """`job 12_[0-44]` for an array's tasks, else the ids."""
    arrays = {i.split("_", 1)[0] for i in ids}
    if len(ids) > 1 and len(arrays) == 1 and all("_" in i for i in ids):
        return f"job {arrays.pop()}_[0-{len(ids) - 1}]"
    return f"job {', '.join(ids)}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def status_lines(runs: list[Run], now: dict[str, RunState]) -> list[str]:
    """The grid's states as a table: run, state, job, what more there is to say."""
    width = max([len(r.name) for r in runs] + [3])
    head = f"{'run':<{width}}  {'state':<8}  {'job':<12}  detail"
    rows = []
    for run in runs:
        state = now[run.name]
        rows.append(f"{run.name:<{width}}  {state.state:<8}  {state.job or '-':<12}  {state.detail}".rstrip())
    return [head, *rows, f"{_plural(len(runs), 'run')}: {_counts(now)}"]
