"""What each supported Python runs beyond the suite's own: `.ci/run` runs the whole suite on one Python
and, from a fresh clone on each other supported Python (3.12 and 3.13 there), its install and this
file with `test_compat.py` and the gRPC + TLS and MQTT + S3 commands of `test_docs_cross_silo.py`
and `test_docs_deployment_modes.py` (INTERPRETER_SET, with FEDML_MOON_INTERPRETER_SET=1). On the
suite's Python these run as every other test does, except those the suite runs already there
(`beside_the_suite`): the MPI simulation's command (tests/test_docs_deployment_modes.py runs it as
written) and the standalone check of MOON (the conformance check's standalone path runs on other
algorithms in tests/test_contributor_kit.py and tests/test_one_form.py, MOON's resume, secure sums
and stacked parties in their own tests).

Every test here starts the real command, as written, in its own processes: what is tested is that
the interpreter, its libraries and the documented command run together."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.doc_commands import MPI_SIMULATION
from tests.support.doc_runs import completed, quiet, run_all, shell_env, tiny_sets
from tests.support.marks import needs_fmnist

INTERPRETER_SET = [
    "tests/test_interpreters.py",
    "tests/test_compat.py",
    "tests/test_docs_cross_silo.py::test_grpc_tls_commands",
    "tests/test_docs_deployment_modes.py::test_mqtt_s3_commands",
]
"""The tests `.ci/run` runs on each supported Python besides the suite's (its fresh clone's)."""

beside_the_suite = pytest.mark.skipif(
    os.environ.get("FEDML_MOON_INTERPRETER_SET") != "1",
    reason="the suite runs this on its own Python already; .ci/run runs it on each other Python",
)
MAIN = "bash run/main.sh"
CHECK_MOON = ".venv/bin/fedml-moon check moon --cf config/fashion_mnist/moon.yaml --modes standalone"


def test_the_interpreter_set_names_tests_that_exist():
    for node in INTERPRETER_SET:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        tests = {f.name for f in ast.parse((ROOT / path).read_text()).body if isinstance(f, ast.FunctionDef)}
        assert not name or name in tests, node


@needs_fmnist
@pytest.mark.slow
def test_the_main_job_as_the_readme_starts_it(tmp_path, home):
    """`bash run/main.sh` (its install current: the stamp) trains MOON and says which Python it runs."""
    out = tmp_path / "run"
    cmd = [*shlex.split(MAIN), *tiny_sets(MAIN), "--output-dir", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=shell_env(home), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"setup: done (.venv: Python {python}, torch " in done.stderr, done.stderr[:2000]
    summary = completed(out, 1)
    assert summary["config"]["train_args"]["algorithm"] == "moon" and 0 < summary["final_test_acc"] <= 1


@needs_fmnist
@pytest.mark.slow
@beside_the_suite
def test_the_mpi_simulation(tmp_path, home):
    """The MPI simulation under mpirun: a server and two workers (mpi4py, Open MPI)."""
    out = tmp_path / "run"
    cmd = [*shlex.split(MPI_SIMULATION), *tiny_sets(MPI_SIMULATION), "--output-dir", str(out)]
    for log_path in run_all([cmd], tmp_path / "logs", home, 600):
        quiet(log_path)
    completed(out, 1)


@needs_fmnist
@pytest.mark.slow
@beside_the_suite
def test_moons_conformance_check_in_standalone(tmp_path, home):
    """`fedml-moon check moon --modes standalone`: resume in a fresh process, secure sums against the
    plain aggregate, stacked parties against sequential ones."""
    cmd = shlex.split(CHECK_MOON)  # as written: the check's own small settings
    done = subprocess.run(cmd, cwd=ROOT, env=shell_env(home), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    passed, total = map(int, last.removeprefix("moon: ").split(" checks passed")[0].split(" of "))
    assert passed == total > 0 and "FAIL" not in done.stdout, done.stdout


@pytest.mark.slow
def test_the_lock_of_this_python_is_what_the_venv_holds():
    """run/setup.sh installs the lock as it is written: `.venv` holds exactly its packages."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    lock = ROOT / "requirements" / f"py{python}.txt"
    pinned = {line.strip() for line in lock.read_text().splitlines() if line.strip() and line[0] != "#"}
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable", "--all"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.splitlines()
    held = {line for line in frozen if line and not line.startswith(("pip==", "wheel=="))}
    assert held == pinned, {"not in the lock": held - pinned, "not installed": pinned - held}
    assert "fedml==0.9.6" in pinned and any(p.startswith("numpy==2.") for p in pinned)


@pytest.mark.slow
def test_the_documented_own_environment_install_installs_the_lock_only(tmp_path):
    """`python3.X -m pip install --no-deps -r requirements/py3.X.txt -e .` (docs: FedML compatibility),
    run as written but as a dry run into this `.venv`: nothing to install but the plugin itself."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report)]
    cmd += ["--no-deps", "-r", f"requirements/py{python}.txt", "-e", "."]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installed == ["fedml_moon"], installed


@pytest.mark.slow
@pytest.mark.parametrize(
    "python, says",
    [
        ("fake-3.14", "is Python 3.14; fedml_moon supports CPython 3.11, 3.12 and 3.13"),
        ("no-such-python3", "does not run; fedml_moon supports CPython 3.11, 3.12 and 3.13"),
    ],
)
def test_setup_refuses_an_unsupported_python_naming_the_versions(tmp_path, python, says):
    """`PYTHON=` an interpreter run/setup.sh does not support: refused before anything is installed."""
    fake = tmp_path / "fake-3.14"
    fake.write_text("#!/bin/sh\necho 3.14\n")
    fake.chmod(0o755)
    stamp = (ROOT / ".venv/setup-stamp").read_text() if (ROOT / ".venv/setup-stamp").is_file() else None
    env = {**os.environ, "PYTHON": str(fake) if python == "fake-3.14" else python}
    done = subprocess.run(
        ["bash", "run/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "installing" not in done.stderr
    now = (ROOT / ".venv/setup-stamp").read_text() if (ROOT / ".venv/setup-stamp").is_file() else None
    assert now == stamp
