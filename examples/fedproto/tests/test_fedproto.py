"""fedproto through the conformance suite: payloads, stacked parties, resume, secure sums and
every deployment mode (`fedml-moon check`; MPI, mosquitto and moto must be installed for all modes)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MODES = None  # or a subset, e.g. "standalone,cross-silo-grpc"


def test_fedproto_passes_fedml_moon_check(tmp_path):
    cmd = [sys.executable, "-m", "fedml_moon", "check", "fedproto", "--cf", str(HERE / "fedproto.yaml")]
    cmd += ["--modes", MODES] if MODES else []
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
