"""What one token holder can make the gRPC server hold by opening more connections: the server reads
ahead at most `comm_args.receive_window_kb` of each incoming call, so each further connection sending
7 MB frames adds a few MB, not its frames (gRPC's own probing widened the window to their size:
`--window-kb 0` adds 20 MB a connection); and in each phase of the run it decodes at most the frames
the rank owes and SPARE_FRAMES more of them, refusing the rest undecoded. Measured through
benchmarks/server_memory.py, the server alone in its process (peak resident set, VmHWM), TLS and
tokens as in a run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedml_moon.distributed.transport.budget import SPARE_FRAMES

pytestmark = pytest.mark.slow
BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "server_memory.py"
PER_CONNECTION_MB = 8  # the window (1 MiB), TLS and socket buffers, with room to spare


def _flood(connections: int) -> dict[str, float]:
    cmd = [sys.executable, str(BENCHMARK), "--connections", str(connections), "--seconds", "4"]
    cmd += ["--phase-s", "2", "--no-baseline"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=True).stdout
    line = out.strip().splitlines()[-1]
    assert f"connections={connections} token=valid window_kb=1024" in line, line
    figures = {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+)(?=\s|$)", line)}
    assert figures["calls"] >= 50, line  # the attack took place
    # the mechanism, not a measurement: rank 3 owes one frame a phase, and may send SPARE_FRAMES more
    assert 0 < figures["decoded"] <= figures["phases"] * (1 + SPARE_FRAMES), line
    return figures


def test_more_connections_of_one_rank_add_the_read_ahead_window_not_their_frames():
    one, sixteen = _flood(1), _flood(16)
    # past its allowance a frame is refused undecoded, or (a loaded server reads less ahead) unread
    never_decoded = sixteen.get("refused_undecoded", 0) + sixteen.get("refused_unread", 0)
    assert never_decoded > 0 and sixteen["refused"] >= 100, sixteen
    growth = sixteen["peak_growth_mb"] - one["peak_growth_mb"]
    assert growth <= 15 * PER_CONNECTION_MB, (one, sixteen)
