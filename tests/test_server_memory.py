"""What one token holder can make the gRPC server hold by opening more connections: the server reads
ahead at most `comm_args.receive_window_kb` of each incoming call, so each further connection sending
7 MB frames adds a few MB, not its frames (gRPC's own probing widened the window to their size:
`--window-kb 0` adds 20 MB a connection). Measured through benchmarks/server_memory.py, the server
alone in its process (peak resident set, VmHWM), TLS and tokens as in a run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "server_memory.py"
PER_CONNECTION_MB = 8  # the window (1 MiB), TLS and socket buffers, with room to spare


def _peak_growth_mb(connections: int) -> float:
    cmd = [sys.executable, str(BENCHMARK), "--connections", str(connections), "--seconds", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=True).stdout
    line = out.strip().splitlines()[-1]
    assert f"connections={connections} token=valid window_kb=1024" in line, line
    assert int(re.search(r"refused=(\d+)", line)[1]) >= 100, line  # the attack took place
    return float(re.search(r"peak_growth_mb=(-?\d+)", line)[1])


def test_more_connections_of_one_rank_add_the_read_ahead_window_not_their_frames():
    one, sixteen = _peak_growth_mb(1), _peak_growth_mb(16)
    assert sixteen - one <= 15 * PER_CONNECTION_MB, (one, sixteen)
