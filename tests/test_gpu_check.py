"""benchmarks/gpu_check.sh, the GPU machine's checks in one command, run here on the CPU at its quick
scale (QUICK=1): its stages run the real entry points and write their figures; a stage that needs
FedML where FedML does not import is skipped saying why, and the others still run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_commands import GPU_CHECK

ROOT = Path(__file__).resolve().parents[1]


def _check(out: Path, *stages: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The documented command, its output folder `out`, the `stages` named, at quick scale."""
    *words, folder = shlex.split(GPU_CHECK)
    assert folder == "outputs/gpu_check"
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHON"}  # the command's own default
    env = {**inherited, "QUICK": "1", **(env or {})}
    return subprocess.run(
        [*words, str(out), *stages], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_gpu_check_runs_the_main_job_and_a_grpc_run_with_a_silo_on_the_gpu_and_writes_figures(tmp_path):
    done = _check(tmp_path / "out", "env", "job", "grpc")
    assert done.returncode == 0, done.stderr
    figures = (tmp_path / "out" / "figures.txt").read_text()
    assert "env: fedml=0.9.6" in figures and "gpu_check: job: exit 0" in figures, figures
    assert "gpu_check: grpc: exit 0" in figures, figures
    job = [line for line in figures.splitlines() if line.startswith("job: ")]
    assert any("training on cpu" in line for line in job) and any(
        "done: final_test_acc" in line for line in job
    )
    # the silo asked for the GPU says which device it got; the server and the other silo stay on the CPU
    assert "rank 1 INFO fedml_moon.adapters.run: device: cpu (no CUDA device is visible)" in figures
    assert "rank 2 INFO fedml_moon.adapters.run: device: cpu (device_args.using_gpu: false)" in figures
    summary = json.loads((tmp_path / "out" / "runs" / "grpc" / "summary.json").read_text())
    assert f"grpc: final_test_acc={summary['final_test_acc']}" in figures, figures


def _cuda_cases() -> int:
    """How many cases `-m cuda` selects in the whole suite."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return int(re.search(r"(\d+)/\d+ tests collected", listed.stdout)[1])


@pytest.mark.slow
def test_without_fedml_its_stages_are_skipped_saying_why_and_the_others_run(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['fedml'] = None  # as if not installed\n"
    )
    done = _check(tmp_path / "out", "env", "job", "tests", "memory", env={"PYTHONPATH": str(blocker)})
    assert done.returncode == 0, done.stderr
    figures = (tmp_path / "out" / "figures.txt").read_text()
    assert "env: fedml=none" in figures, figures
    for stage in ("job", "memory"):
        assert f"gpu_check: {stage}: skipped: FedML's parts do not import with Python 3." in figures, figures
    # the CUDA tests need no FedML: the stage runs `pytest -m cuda` over the files that hold CUDA
    # cases only (the others import FedML); it reaches every case the marker selects in the suite
    # (skipped here for want of a GPU), none failing
    log = (tmp_path / "out" / "tests.log").read_text()
    assert "gpu_check: tests: exit 0" in figures, log[-3000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|failed)", log)}
    assert counts.get("skipped", 0) >= 40 and sum(counts.values()) == _cuda_cases(), log[-2000:]
    # only the stages named ran
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["env.txt", "figures.txt", "tests.log"]


@pytest.mark.slow
def test_an_unknown_stage_is_refused_naming_the_stages_before_any_runs(tmp_path):
    done = _check(tmp_path / "out", "env", "envv")
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert (
        "unknown stage 'envv' (stages: env tests cnn kernels resnet job tf32 grpc networks memory)"
        in done.stderr
    )


@pytest.mark.slow
def test_a_stage_out_of_time_leaves_no_process_behind_and_the_next_stage_runs(tmp_path):
    out = tmp_path / "out"
    done = _check(out, "grpc", "env", env={"LIMIT_S": "4"})
    assert done.returncode == 0, done.stderr
    figures = (out / "figures.txt").read_text()
    assert "gpu_check: grpc: exit 124" in figures and "env: fedml=0.9.6" in figures, figures
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes of the stage still running: {left}"


@pytest.mark.slow
def test_carried_wheels_are_installed_beside_the_machines_own_packages(tmp_path):
    """A Python that lacks a package gets it from the wheels carried in WHEELS (gpu_wheels.sh's
    folder): installed, without touching that Python, into OUT_DIR/site (the stages' PYTHONPATH)."""
    project = tmp_path / "probe"
    (project / "carried_probe").mkdir(parents=True)
    (project / "carried_probe" / "__init__.py").write_text("VALUE = 'carried'\n")
    (project / "pyproject.toml").write_text('[project]\nname = "carried_probe"\nversion = "1.0"\n')
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels)]
        + [str(project)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    done = _check(tmp_path / "out", "env", env={"WHEELS": str(wheels)})
    assert done.returncode == 0, done.stderr
    site = tmp_path / "out" / "site"
    assert (site / "carried_probe" / "__init__.py").is_file()
    probe = subprocess.run(
        [sys.executable, "-c", "import carried_probe; print(carried_probe.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "carried"


def test_the_wheels_named_for_a_gpu_machine_are_pinned_in_its_lock():
    """benchmarks/gpu_wheels.sh fetches each of its packages at the version of the Python's lock."""
    script = (ROOT / "benchmarks" / "gpu_wheels.sh").read_text()
    (line,) = re.findall(r'^GPU_WHEELS="([^"]+)"$', script, flags=re.M)
    lock = (ROOT / "requirements" / "py3.12.txt").read_text().lower().replace("_", "-")
    pinned = set(re.findall(r"^([a-z0-9.-]+)==", lock, flags=re.M))
    assert "fedml" in line.split() and not set(line.split()) - pinned, set(line.split()) - pinned
