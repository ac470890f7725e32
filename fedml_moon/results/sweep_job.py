"""What one job of a cluster sweep runs: the run's own `fedml-moon simulate` (the command a local
sweep runs, chosen when the job starts: a new run, or `--resume` from its last checkpoint), its
output in the run folder's `run.log`, the job's output linked as `job.out`, and `job.json` saying
which job ran it and how it ended.

At its time limit (SIGUSR2 from Slurm, or from submitit's local controller) the job stops the run,
which keeps its last checkpoint, and submitit requeues the job: started again, it goes on from
that checkpoint. The run itself ignores SIGUSR2; the job decides.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedml_moon.results.sweep import Run
from fedml_moon.run_folder import RunFolder, write_json

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run's process ended without completing the run."""


def _ignore_usr2() -> None:  # in the run's process, before it starts: the job handles SIGUSR2
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class SweepJob:
    """The callable submitit runs in the job (pickled by the submitting process into the sweep's
    folder). `threads`: the run's PyTorch threads (the job's CPUs), None for the run's own choice;
    `grace_s`: how long a stopped run may take to write what it has before it is killed."""

    def __init__(self, run: Run, batch: str, threads: int | None = None, grace_s: float = 60.0) -> None:
        self.run = run
        self.batch = batch
        self.threads = threads
        self.grace_s = grace_s
        self._child: subprocess.Popen | None = None
        self._job: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        fields = ("run", "batch", "threads", "grace_s")
        return {**{k: getattr(self, k) for k in fields}, "_child": None, "_job": None}

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.run.folder)

    def _note(self, **fields: Any) -> None:
        """Rewrite the run's job.json: which job ran it, on which host, and `fields`."""
        note = {"batch": self.batch, "host": socket.gethostname(), **fields}
        write_json(self.folder.job, note, indent=1)

    def _link_output(self, job_output: Path) -> None:
        link = self.folder.job_output
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(job_output, self.run.folder))

    def __call__(self) -> str:
        import submitit

        env = submitit.JobEnvironment()
        _once(signal.SIGUSR2)  # submitit's handler: checkpoint() and requeue
        self.run.folder.mkdir(parents=True, exist_ok=True)
        self._job = env.job_id
        self._link_output(env.paths.stdout)
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        if self.run.state() == "complete":  # e.g. requeued after its last checkpoint
            self._note(job=env.job_id, state="complete", exit_code=0, started=started)
            return "complete"
        self._note(job=env.job_id, state="running", pid=os.getpid(), started=started)
        code = self._run()
        complete = code == 0 and self.run.state() == "complete"
        state = "complete" if complete else "failed"
        self._note(job=env.job_id, state=state, exit_code=code, started=started)
        if not complete:
            raise RunFailed(f"run {self.run.name} ended with exit code {code}; see {self.folder.run_log}")
        return "complete"

    def _run(self) -> int:
        """The run's `fedml-moon simulate` (new, or `--resume`), its output in run.log; its exit code."""
        argv = self.run.argv([sys.executable, "-m", "fedml_moon"], self.threads)
        with self.folder.run_log.open("ab") as out:
            out.write(f"$ {shlex.join(argv)}\n".encode())
            out.flush()
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_ignore_usr2)
            self._child = child
            try:
                return child.wait()
            except KeyboardInterrupt:  # a local sweep stopped with Ctrl-C: the run stops with it
                _ended(child.pid, 30.0)
                self._note(job=self._job, state="interrupted", exit_code=None)
                raise

    def checkpoint(self) -> Any:
        """At the time limit or a preemption (in submitit's SIGUSR2 handler, while `__call__` waits
        on the run): stop the run (SIGTERM; it keeps its last checkpoint), wait for it without
        reaping it (that is `__call__`'s wait), and hand submitit this job again to requeue: started
        again, it goes on with `--resume`."""
        from submitit.helpers import DelayedSubmission

        child = self._child
        if child is not None and not _ended(child.pid, 0):
            log.info("stopping run %s to requeue its job", self.run.name)
            os.kill(child.pid, signal.SIGTERM)
            if not _ended(child.pid, self.grace_s):
                os.kill(child.pid, signal.SIGKILL)
                _ended(child.pid, 10.0)
        self._note(job=self._job, state="requeued", exit_code=None)
        with self.folder.run_log.open("a") as out:
            out.write(
                f"job {self._job} stopped the run at its time limit (or a preemption); it goes on from "
                "the last checkpoint when the job starts again (slurm.timeouts_requeued times at most)\n"
            )
        return DelayedSubmission(SweepJob(self.run, self.batch, self.threads, self.grace_s))


def _ended(pid: int, within_s: float) -> bool:
    """Whether process `pid` (a child) has ended, waiting up to `within_s`; it is left unreaped."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:  # already reaped
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _once(signum: int) -> None:
    """Let the handler of `signum` run once: Slurm may deliver the same signal twice to a task."""
    handler = signal.getsignal(signum)
    if not callable(handler):
        return

    def first(number: int, frame: Any) -> None:
        signal.signal(number, signal.SIG_IGN)
        handler(number, frame)

    signal.signal(signum, first)
