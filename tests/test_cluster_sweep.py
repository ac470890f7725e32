"""A sweep through a job scheduler, on a real one: each test runs against a one-node Slurm cluster
started on this machine (tests/support/slurm_cluster.py: munged + slurmctld + slurmd) and against
submitit's local executor (real job processes). Where Slurm cannot start, its tests are skipped
naming why, and the local executor's run alone.

The claims: every run of the grid completes exactly once, each round recorded once; a job cancelled
mid-run is failed in `--status` with its error and goes on from its checkpoint at the next
submission; a job at its time limit requeues itself and goes on; a submitting process killed
between recording a submission and recording its job ids, or between two submissions, leaves
nothing submitted twice and nothing lost; the report reads the folder; the resources reach Slurm."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.results.jobs import _cmdline
from tests.support import slurm_cluster
from tests.support.processes import fresh_python
from tests.support.sweeps import TINY_GRID

ROOT = Path(__file__).resolve().parent.parent
FEDML_MOON = [sys.executable, "-m", "fedml_moon"]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
SWEEP = (  # the local sweep's tiny grid, one seed: MOON and FedAvg
    TINY_GRID.replace("  common_args.random_seed: [0, 1]\n", "")
    + 'slurm:\n  time: "00:10:00"\n  signal_delay_s: 30\n'
)


@pytest.fixture(scope="module")
def slurm() -> Iterator[slurm_cluster.Cluster]:
    try:
        cluster = slurm_cluster.start()
    except slurm_cluster.Unavailable as err:
        pytest.skip(f"Slurm cannot start here ({err}); the local executor's tests ran instead")
    yield cluster
    cluster.stop()


@pytest.fixture(params=["local", "slurm"])
def on(request: pytest.FixtureRequest) -> str:
    return request.param


class Sweep:
    """A two-run sweep file in a temporary folder, and the commands a user types on it."""

    def __init__(self, tmp_path: Path, on: str, env: dict[str, str], rounds: int) -> None:
        self.on, self.env = on, env
        self.out = tmp_path / "out"
        self.file = tmp_path / "tiny.yaml"
        self.file.write_text(SWEEP.format(root=ROOT, out=self.out, rounds=rounds))
        self.rounds = rounds

    def folder(self, algorithm: str) -> Path:
        return self.out / f"algorithm={algorithm}"

    def argv(self, *extra: str) -> list[str]:
        return [*FEDML_MOON, "sweep", str(self.file), *extra]

    def submit(self, *extra: str) -> subprocess.Popen:
        """`sweep --on ...`, running (local jobs are waited for; Slurm's with --wait)."""
        wait = ["--wait"] if self.on == "slurm" else []
        return subprocess.Popen(
            self.argv("--on", self.on, "--jobs", "2", "--poll", "1", *wait, *extra),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def status(self) -> dict[str, list[str]]:
        done = subprocess.run(self.argv("--status"), env=self.env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        rows = [line.split(None, 3) for line in done.stdout.splitlines()[1:-1]]
        return {row[0]: row[1:] + [""] * (4 - len(row)) for row in rows}

    def record(self) -> dict:
        return json.loads((self.out / "jobs.json").read_text())

    def job(self, algorithm: str) -> str:
        return self.record()["runs"][f"algorithm={algorithm}"]["job"]


@pytest.fixture
def sweep(request: pytest.FixtureRequest, tmp_path: Path, on: str) -> Iterator[Callable[[int], Sweep]]:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    if on == "slurm":
        env = {**env, "SLURM_CONF": request.getfixturevalue("slurm").env["SLURM_CONF"]}
    made: list[Sweep] = []

    def make(rounds: int) -> Sweep:
        made.append(Sweep(tmp_path, on, env, rounds))
        return made[-1]

    yield make
    for s in made:  # nothing of a test goes on after it
        if on == "slurm":
            subprocess.run(["scancel", "-n", ",".join(_job_names(s))], env=env, capture_output=True)
        _kill_local_jobs(s.out)


def _job_names(s: Sweep) -> list[str]:
    try:
        return [b["name"] for b in s.record()["batches"].values()] or ["-"]
    except OSError:
        return ["-"]


def _kill_local_jobs(out: Path) -> None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and str(out) in _cmdline(int(entry.name)):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _until(condition: Callable[[], bool], what: str, within_s: float = 180.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {within_s:.0f} s for {what}"
        time.sleep(0.3)


def _rounds(folder: Path) -> list[int]:
    try:
        return [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    except OSError:
        return []


def _starts(folder: Path) -> list[str]:
    """The commands the run's jobs started, in order (run.log's `$ ...` lines)."""
    return [line for line in (folder / "run.log").read_text().splitlines() if line.startswith("$ ")]


def _run_pid(folder: Path) -> int:
    """The run's own process (the job's child running `fedml-moon simulate`)."""
    job_pid = json.loads((folder / "job.json").read_text())["pid"]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and "simulate" in _cmdline(int(entry.name)):
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == job_pid:
                return int(entry.name)
    raise AssertionError(f"no run process under job process {job_pid}")


def _finished(proc: subprocess.Popen, within_s: float = 300.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


@contextmanager
def _midway(s: Sweep, proc: subprocess.Popen, rounds: int, job: bool = True) -> Iterator[Path]:
    """Once MOON's run has `rounds` rounds (and, with `job`, its job has noted itself): its folder;
    `proc` killed afterwards if it still runs."""
    moon = s.folder("moon")

    def there() -> bool:
        return len(_rounds(moon)) >= rounds and (not job or (moon / "job.json").is_file())

    try:
        _until(there, f"{rounds} round(s) of moon")
        yield moon
    finally:
        if proc.poll() is None:
            proc.kill()


def _completed_each_started_once(s: Sweep, code: int, err: str) -> None:
    """The sweep command succeeded, every run completed with each round once, from one start."""
    assert code == 0, err[-2000:]
    _each_round_once(s)
    assert all(len(_starts(s.folder(a))) == 1 for a in ("moon", "fedavg"))


def _each_round_once(s: Sweep) -> None:
    for algorithm in ("moon", "fedavg"):
        folder = s.folder(algorithm)
        assert json.loads((folder / "summary.json").read_text())["status"] == "completed"
        assert _rounds(folder) == list(range(s.rounds)), algorithm


def test_a_cancelled_run_is_failed_with_its_error_and_the_next_submission_resumes_it(sweep, on):
    s = sweep(8)
    first = s.submit()
    with _midway(s, first, 2) as moon:
        if on == "slurm":
            subprocess.run(["scancel", s.job("moon")], env=s.env, check=True)
        else:  # the local executor has no scancel: the run is stopped as Slurm stops it, by SIGTERM
            os.kill(_run_pid(moon), signal.SIGTERM)
        code, err = _finished(first)
    assert code == 1, err[-2000:]  # waited for, one run not complete
    state, job, detail = s.status()["algorithm=moon"]
    assert state == "failed" and job == s.job("moon")
    assert "terminated (SIGTERM)" in detail and (on == "local" or detail.startswith("CANCELLED"))
    assert s.status()["algorithm=fedavg"][0] == "complete"
    stopped_at = len(_rounds(moon))
    assert 2 <= stopped_at < s.rounds
    other = subprocess.run(  # going on with another config is refused before anything is submitted
        s.argv("--on", on, "--set", "train_args.learning_rate=0.2"), env=s.env, capture_output=True, text=True
    )
    assert (
        other.returncode == 2 and "sweep run algorithm=moon would go on from its checkpoint" in other.stderr
    )
    assert "train_args.learning_rate" in other.stderr and len(_starts(moon)) == 1

    code, err = _finished(s.submit())
    assert code == 0, err[-2000:]
    _each_round_once(s)
    starts = _starts(moon)
    assert len(starts) == 2 and "--resume" in starts[1] and "--resume" not in starts[0]
    assert len(_starts(s.folder("fedavg"))) == 1  # complete: not submitted again
    assert {row[0] for row in s.status().values()} == {"complete"}
    report = subprocess.run([*FEDML_MOON, "report", str(s.out)], env=s.env, capture_output=True, text=True)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (s.out / "report" / "report.md").is_file()


def test_a_job_at_its_time_limit_requeues_itself_and_goes_on_from_its_checkpoint(sweep, on, request):
    s = sweep(8)
    proc = s.submit()
    with _midway(s, proc, 2) as moon:
        job = s.job("moon")
        if on == "slurm":  # what Slurm sends signal_delay_s before the limit (submitit's own test does this)
            subprocess.run(["scancel", "--signal=USR2", job], env=s.env, check=True)
            first = json.loads((moon / "job.json").read_text())["pid"]  # read before the job rewrites it
            _until(lambda: "PENDING" in s.status()["algorithm=moon"][2], "the requeued job", 60)
            _start_again_soon(s, job, first)
        else:  # submitit's local controller sends the job SIGUSR2 at its time limit
            os.kill(json.loads((moon / "job.json").read_text())["pid"], signal.SIGUSR2)
        code, err = _finished(proc)
    assert code == 0, err[-2000:]
    _each_round_once(s)
    starts = _starts(moon)
    assert len(starts) == 2 and "--resume" in starts[1]
    assert s.job("moon") == job  # the same job, requeued: not a new submission
    assert "Requeued job" in (moon / "job.out").read_text()


def _start_again_soon(s: Sweep, job: str, first_pid: int) -> None:
    """Start a requeued job now, not after the BeginTime Slurm gives it (its credential's lifetime,
    2 minutes). Not while its first start ends: slurmd refuses a launch whose credential (stamped in
    whole seconds) is not newer than the job's revocation at the end of that start. So: once the
    first start's process is gone, and the clock is in a later second."""
    _until(lambda: not Path(f"/proc/{first_pid}").exists(), "the job's first start to end", 60)
    later = int(time.time()) + 1
    _until(lambda: time.time() >= later, "the next second", 5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=s.env, check=True)


def test_a_submission_recorded_without_its_job_ids_is_found_not_made_again(sweep, on):
    """The state a submitting process leaves when killed after submitting, before writing the job
    ids: the next call finds the jobs (by the batch's job name or folder) and submits nothing."""
    from fedml_moon.results import jobs, submit
    from fedml_moon.results.cluster import SlurmArgs, executor
    from fedml_moon.results.sweep import load_sweep
    from fedml_moon.results.sweep_job import SweepJob

    s = sweep(6)
    runs = submit.absolute(load_sweep(s.file))
    record = jobs.read(s.out)
    for i, batch_runs in enumerate([runs] if on == "slurm" else [[r] for r in runs]):
        batch = f"crashed{i}"
        name, where = f"fedml-moon-sweep-{batch}", s.out / ".submitit" / batch
        jobs.begin(record, batch, on, batch_runs, name, where)
        jobs.write(s.out, record)
        old = dict(os.environ)
        os.environ.update(s.env)
        try:
            ex = executor(on, where, SlurmArgs(time=10), name)
            with ex.batch():
                for run in batch_runs:
                    ex.submit(SweepJob(run, batch))
        finally:
            os.environ.clear()
            os.environ.update(old)
    assert all(r["job"] is None for r in s.record()["runs"].values())  # what a crash there leaves

    code, err = _finished(s.submit())
    assert code == 0, err[-2000:]
    assert "0 submitted now" in err or on == "local"
    _each_round_once(s)
    for algorithm in ("moon", "fedavg"):
        assert len(_starts(s.folder(algorithm))) == 1  # one job each: found, not submitted again
    assert sorted(s.record()["batches"]) == (["crashed0"] if on == "slurm" else ["crashed0", "crashed1"])


@pytest.mark.parametrize("on", ["local"])  # Slurm takes a call's runs in one submission (an array)
def test_a_submitter_killed_between_two_submissions_leaves_one_job_a_run(sweep, on):
    s = sweep(6)
    proc = subprocess.Popen(
        s.argv("--on", "local", "--jobs", "1", "--poll", "1"), env=s.env, stderr=subprocess.DEVNULL
    )
    with _midway(
        s, proc, 1, job=False
    ) as moon:  # the first run's job runs, the second is not yet submitted: kill -9 the submitter
        assert len(s.record()["runs"]) == 1
        proc.kill()
        proc.wait()
    assert len(_rounds(moon)) < s.rounds  # the first job still runs, orphaned
    code, err = _finished(s.submit())
    assert code == 0, err[-2000:]
    _each_round_once(s)
    for algorithm in ("moon", "fedavg"):
        assert len(_starts(s.folder(algorithm))) == 1, algorithm
    assert len(s.record()["batches"]) == 2


@pytest.mark.parametrize("on", ["slurm"])
def test_the_resources_of_the_file_and_the_command_line_reach_slurm(sweep, on):
    s = sweep(2)
    s.file.write_text(s.file.read_text() + "  cpus_per_run: 2\n  sbatch: [--comment=from-the-file]\n")
    argv = s.argv("--on", "slurm", "--cpus", "1", "--mem", "1.5", "--time", "7", "--partition", "debug")
    done = subprocess.run([*argv, "--sbatch=--hold"], env=s.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = subprocess.run(
        ["scontrol", "show", "job", s.job("moon")], env=s.env, capture_output=True, text=True
    ).stdout
    for field in ("Partition=debug", "TimeLimit=00:07:00", "NumCPUs=1", "Comment=from-the-file"):
        assert field in shown, field
    assert "MinMemoryNode=1.50G" in shown and "Reason=JobHeldUser" in shown, shown
    assert s.status()["algorithm=moon"][:2] == ["queued", s.job("moon")]
    # queued (held) jobs are left alone: by the sweep on this machine, and by the next submission
    here = subprocess.run(s.argv(), env=s.env, capture_output=True, text=True)
    assert here.returncode == 0 and "left to it" in here.stderr, here.stderr[-2000:]
    again = subprocess.run(s.argv("--on", "slurm"), env=s.env, capture_output=True, text=True)
    assert again.returncode == 0 and "2 queued; 0 submitted now" in again.stderr, again.stderr[-2000:]
    assert not (s.folder("moon") / "run.log").exists()


@pytest.mark.parametrize("on", ["local"])
def test_a_submission_recorded_but_never_made_is_made_once(sweep, on):
    """The state a submitting process leaves when killed after recording a submission, before
    making it: the next call finds no job of it and submits each run once."""
    from fedml_moon.results import jobs, submit
    from fedml_moon.results.sweep import load_sweep

    s = sweep(2)
    runs = submit.absolute(load_sweep(s.file))
    record = jobs.read(s.out)
    jobs.begin(record, "never", "local", runs[:1], "-", s.out / ".submitit" / "never")
    jobs.write(s.out, record)
    code, err = _finished(s.submit())
    _completed_each_started_once(s, code, err)
    assert "never" not in s.record()["batches"]


def _wrapped_sbatch(tmp_path: Path, env: dict[str, str], before: str, after: str) -> dict[str, str]:
    """The environment with an `sbatch` first on PATH that runs `before`, the real sbatch, then
    `after`: a slow or failing sbatch as a loaded controller gives one."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "sbatch"
    real = shutil.which("sbatch", path=env.get("PATH")) or "/usr/bin/sbatch"
    script.write_text(f'#!/bin/bash\n{before}\n{real} "$@" || exit $?\n{after}\n')
    script.chmod(0o755)
    return {**env, "PATH": f"{folder}:{env['PATH']}"}


@pytest.mark.parametrize("on", ["slurm"])
def test_an_sbatch_that_fails_after_slurm_took_the_jobs_leaves_none_queued(sweep, on, tmp_path):
    s = sweep(2)
    env = _wrapped_sbatch(tmp_path, s.env, "", 'echo "sbatch: error: Socket timed out" >&2; exit 1')
    done = subprocess.run(s.argv("--on", "slurm"), env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "refused the submission" in done.stderr, done.stderr[-2000:]
    assert "cancelling job" in done.stderr  # Slurm took them; they never got their runs
    code, err = _finished(s.submit())
    _completed_each_started_once(s, code, err)


@pytest.mark.parametrize("on", ["slurm"])
def test_a_submitter_killed_while_its_sbatch_runs_leaves_one_job_a_run(sweep, on, tmp_path):
    s = sweep(2)
    env = _wrapped_sbatch(tmp_path, s.env, "sleep 15", "")
    first = subprocess.Popen(s.argv("--on", "slurm"), env=env, stderr=subprocess.DEVNULL)
    _until(lambda: (s.out / "jobs.json").is_file() and bool(s.record()["batches"]), "the recorded submission")
    time.sleep(1)
    first.kill()  # sbatch goes on without it
    first.wait()
    again = subprocess.run(s.argv("--on", "slurm"), env=s.env, capture_output=True, text=True)
    assert again.returncode == 0 and "0 submitted now" in again.stderr, again.stderr[-2000:]
    assert {row[0] for row in s.status().values()} == {"queued"}  # being submitted
    _until(lambda: not jobs_submitting(s), "the orphaned sbatch", 60)
    code, err = _finished(s.submit())  # its jobs never got their runs: cancelled, submitted again
    _completed_each_started_once(s, code, err)


def jobs_submitting(s: Sweep) -> bool:
    from fedml_moon.results.jobs import submitting

    return any(submitting(b["folder"]) for b in s.record()["batches"].values())


@pytest.mark.parametrize("on", ["slurm"])
def test_a_job_slurm_has_stopped_is_not_submitted_again_whoever_the_environment_says_we_are(sweep, on):
    s = sweep(6)
    proc = s.submit()
    with _midway(s, proc, 1):
        job = s.job("moon")
        subprocess.run(["scancel", "--signal=STOP", job], env=s.env, check=True)
        other = {**s.env, "USER": "alice", "LOGNAME": "alice"}
        again = subprocess.run(s.argv("--on", "slurm"), env=other, capture_output=True, text=True)
        assert again.returncode == 0 and "0 submitted now" in again.stderr, again.stderr[-2000:]
        assert s.status()["algorithm=moon"][:2] == ["running", job]
        subprocess.run(["scancel", "--signal=CONT", job], env=s.env, check=True)
        code, err = _finished(proc)
    _completed_each_started_once(s, code, err)


@pytest.mark.parametrize("on", ["slurm"])
def test_a_job_that_fails_before_its_run_starts_shows_its_error(sweep, on):
    s = sweep(2)
    s.file.write_text(s.file.read_text() + '  setup: ["echo cuda module missing >&2; exit 3"]\n')
    code, err = _finished(s.submit())
    assert code == 1, err[-2000:]
    state, _, detail = s.status()["algorithm=moon"]
    assert state == "failed" and "cuda module missing" in detail, detail


@pytest.mark.parametrize("on", ["local"])
def test_runs_of_a_killed_sweep_that_still_run_are_not_started_twice(sweep, on):
    s = sweep(40)
    here = subprocess.Popen(s.argv("--jobs", "1"), env=s.env, stderr=subprocess.DEVNULL)
    with _midway(s, here, 1, job=False):
        here.kill()  # its run goes on (a session of its own), orphaned
        here.wait()
    assert s.status()["algorithm=moon"][0] == "running"
    code, err = _finished(s.submit())
    _completed_each_started_once(s, code, err)


@pytest.mark.parametrize("on", ["local"])
def test_a_job_out_of_time_too_often_says_so(sweep, on):
    s = sweep(40)
    s.file.write_text(s.file.read_text() + "  timeouts_requeued: 0\n")
    proc = s.submit()
    with _midway(s, proc, 1) as moon:
        os.kill(json.loads((moon / "job.json").read_text())["pid"], signal.SIGUSR2)
        code, err = _finished(proc)
    assert code == 1, err[-2000:]
    state, _, detail = s.status()["algorithm=moon"]
    assert state == "failed" and "out of time more often than slurm.timeouts_requeued allows" in detail
    assert "stopped the run at its time limit" in detail  # the run's last line: why it stopped


def test_a_jobs_own_process_and_status_import_no_pytorch(tmp_path):
    """What submitit's job process unpickles (sweep_job.SweepJob) leaves PyTorch to the run it starts
    (a job pays for its run's start-up once), and `sweep FILE --status`, which reads the runs'
    folders, loads no config and imports no PyTorch; nor does `fedml-moon status RUN_DIR`. Fresh
    interpreters, as a job's and a user's: what a process imports is only visible from its start."""
    s = Sweep(tmp_path, "local", {}, 2)
    probes = {
        "job": "import submitit, fedml_moon.results.sweep_job",
        "status": f"from fedml_moon.cli import main\nassert main(['sweep', '{s.file}', '--status']) == 0",
        "run status": f"from fedml_moon.cli import main\nassert main(['status', '{tmp_path / 'run'}']) == 0",
    }
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"round": 0, "round_time_s": 1.0}\n')
    for what, code in probes.items():
        code = f"import sys\n{code}\nprint(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))"
        done = fresh_python(code, tmp_path)
        assert done.returncode == 0, (what, done.stderr[-2000:])
        assert done.stdout.strip().splitlines()[-1] == "[]", (what, done.stdout)
