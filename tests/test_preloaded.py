"""Processes forked from the preloaded server (fedml_moon.conformance.preloaded) are processes of their
own, as `python -m fedml_moon` or `python SCRIPT.py` would start them, and a run forked ends where a
run started fresh ends. Every test here starts processes: what it tests is what a started process is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.conformance import preloaded
from fedml_moon.conformance.recovery import wait_for
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

REPORT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    preloaded = "torch" in sys.modules
    report = {"pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(), "mine": os.environ.get("MINE"),
              "leaked": os.environ.get("ONLY_IN_THE_TEST"), "path": sys.path[:2], "argv": sys.argv,
              "preloaded": preloaded, "stdin": sys.stdin.read()}
    print(json.dumps(report))
    if sys.argv[1] == "hang":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
    """
)


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "scripts" / "report.py"
    script.parent.mkdir()
    script.write_text(REPORT)
    return script


def test_a_forked_script_is_a_process_of_its_own(tmp_path, monkeypatch):
    """Its own pid and session, the working directory, environment (and nothing else of this
    process's), `sys.path` (the script's folder, then PYTHONPATH), argv and exit code it was given;
    stdin is empty, stdout and stderr go to its log; the modules it starts with are the preload."""
    monkeypatch.setenv("ONLY_IN_THE_TEST", "1")
    script, cwd, log = _script(tmp_path), tmp_path / "cwd", tmp_path / "out.log"
    cwd.mkdir()
    env = {"MINE": "yes", "PYTHONPATH": str(tmp_path / "extra"), "PATH": os.environ["PATH"]}
    child = conformance.spawn([sys.executable, str(script), "3"], log, env, cwd)
    assert isinstance(child, preloaded.Forked) and log.is_file()  # the log is there, as a Popen's is
    assert child.wait(timeout=120) == 3 and child.poll() == 3
    report = json.loads(log.read_text().splitlines()[-1])
    assert report["pid"] == child.pid != os.getpid() and report["sid"] == child.pid
    assert report["cwd"] == str(cwd) and report["mine"] == "yes" and report["leaked"] is None
    assert report["path"] == [str(script.parent), str(tmp_path / "extra")]
    assert report["argv"] == [str(script), "3"] and report["stdin"] == ""
    assert report["preloaded"] is True


def test_a_forked_process_is_stopped_with_its_session_and_reports_how_it_ended(tmp_path):
    """`conformance.stop` signals its session (SIGTERM: its handler's exit code); a child killed by a
    signal reports minus that signal, as `subprocess.Popen` does; a wait that runs out says so."""
    script = _script(tmp_path)
    env = {"PATH": os.environ["PATH"]}
    hung = conformance.spawn([sys.executable, str(script), "hang"], tmp_path / "a.log", env, tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(timeout=0.5)
    wait_for(tmp_path / "a.log", '"pid"', 120)
    conformance.stop(hung)
    assert hung.returncode == 7
    killed = conformance.spawn([sys.executable, str(script), "hang"], tmp_path / "b.log", env, tmp_path)
    wait_for(tmp_path / "b.log", '"pid"', 120)
    killed.send_signal(signal.SIGSTOP)  # as a test freezes a silo
    killed.send_signal(signal.SIGCONT)
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL
    killed.terminate()  # a signal to a process that has ended does nothing, as with Popen


def test_the_server_imports_no_transport_and_no_per_process_state():
    """What the server preloads leaves gRPC, protobuf, paho-mqtt, mpi4py, wandb and torchvision to
    each child (they read the child's environment at import), and starts no thread before forking."""
    code = (
        "import json, sys, threading\n"
        f"for m in {preloaded.PRELOAD!r}: __import__(m)\n"
        f"print(json.dumps([[m for m in sys.modules if m.split('.')[0] == n or m == n] for n in "
        f"{list(preloaded.NEVER_PRELOADED)!r}] + [threading.active_count()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    *found, threads = json.loads(done.stdout)
    assert not any(found), found
    assert threads == 1


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_a_forked_run_ends_where_a_fresh_one_ends(tmp_path, monkeypatch):
    """The same standalone run forked and started as a fresh interpreter (FEDML_MOON_PRELOAD=0): the
    same final model and metrics."""
    config, tiny = ROOT / "config/fashion_mnist/fedavg.yaml", [*conformance.TINY, "train_args.comm_round=1"]
    forked = conformance.run_mode("standalone", config, tiny, tmp_path / "forked")
    monkeypatch.setenv("FEDML_MOON_PRELOAD", "0")
    fresh = conformance.run_mode("standalone", config, tiny, tmp_path / "fresh")
    assert forked.ok and fresh.ok, forked.tail() + fresh.tail()
    assert conformance.compare(forked, fresh) == (0.0, [])
    digests = {
        json.loads((r.out_dir / "summary.json").read_text())["final_model_sha256"] for r in (forked, fresh)
    }
    assert len(digests) == 1
