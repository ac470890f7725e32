"""What one rank can make the gRPC server hold over a whole run: its peak memory, quarter by quarter,
while one token holder floods 7 MB frames from many connections, against the same run without it.

The server (TLS, tokens, 16 MB frame limit, as a run's) runs alone in a child process whose main
thread reads its queue and drops what it takes, as a run's server drops a late or repeated message.
The run is a phase every `--phase-s` seconds (a round's train phase: ranks 1 and 3 each owe one
upload, `expect` on the transport); at each phase start the honest rank 1 sends its one 7 MB upload
through a silo's own transport. In the flood run rank 3, with its valid token (or a wrong one), also
sends a 7 MB message on each of `--connections` connections (gRPC's own subchannel each), one call
after another, for the whole run. The run is sampled in quarters: each quarter's peak resident set
(VmHWM, reset at each quarter's start) above the resident set before the run, for the flood and for
the baseline run without it, and their ratio; then the frames rank 3's calls brought: taken by the
main thread, decoded, refused before decoding, refused before being read. Last line:
    connections=<n> token=<valid|wrong> window_kb=<kb> seconds=<s> phases=<n> calls=<n> refused=<n>
    taken=<n> decoded=<n> refused_undecoded=<n> refused_unread=<n> quarters_mb=<q1,q2,q3,q4>
    baseline_quarters_mb=<...> vs_baseline=<r1,r2,r3,r4> q4_vs_q1=<r> peak_growth_mb=<mb>
(`peak_growth_mb`: the flood's highest quarter, the figure the security page gives.)

Run: .venv/bin/python benchmarks/server_memory.py [--connections 64] [--seconds 40] [--token wrong]
[--phase-s 5] [--window-kb 1024] [--no-baseline] [--reconnect]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedml_moon import conformance  # noqa: E402
from fedml_moon.distributed.transport.base import message_bytes  # noqa: E402
from fedml_moon.distributed.transport.grpc_common import SERVICE, GrpcSecurity  # noqa: E402
from fedml_moon.security import load_token_table, make_certs  # noqa: E402

log = logging.getLogger("server_memory")
FRAME_LIMIT_MB = 16
BLOB = 7 << 20


def memory_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def serve(certs: Path, port: int, window_kb: int) -> None:
    """The child: a run's gRPC server whose main thread drops what it takes. Per stdin line: `phase`
    opens a phase (ranks 1 and 3 owe one upload each), `sample` resets the peak after answering; each
    answers one JSON line of its memory and frame counts."""
    from fedml_moon.distributed.transport.grpc_transport import GrpcServerTransport

    logging.basicConfig(level=logging.ERROR)  # the refusals' lines: thousands of them here
    read = lambda name: (certs / name).read_bytes()  # noqa: E731
    tokens = load_token_table(certs / "server-tokens.json")
    keys = {"ca": read("ca.pem"), "cert": read("server.pem"), "key": read("server.key")}
    sec = GrpcSecurity(tls=True, auth="token", tokens=tokens, **keys)
    server = GrpcServerTransport(
        "127.0.0.1", port, FRAME_LIMIT_MB, 3, sec, receive_timeout_s=30, receive_window_kb=window_kb
    )
    if hasattr(server, "expect"):  # the run's first phase, before any silo calls
        server.expect({1: 1, 3: 1})
    taken: Counter = Counter()

    class Drop:  # the run's main thread: a late or repeated message is dropped
        def receive_message(self, kind, msg) -> None:
            taken[msg.get_sender_id()] += 1

    server.add_observer(Drop())
    threading.Thread(target=server.handle_receive_message, daemon=True).start()
    print("listening", flush=True)
    for line in sys.stdin:
        if line.strip() == "phase" and hasattr(server, "expect"):
            server.expect({1: 1, 3: 1})
        rss, hwm = memory_kb()
        frames = {k[1]: v for k, v in getattr(server, "frames", {}).items() if k[0] == 3}
        print(json.dumps({"rss": rss, "hwm": hwm, "taken": taken[3], "frames": frames}), flush=True)
        if line.strip() == "sample":
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
    server.stop_receive_message()


def attack(
    certs: Path, port: int, connections: int, stop: threading.Event, token: str, reconnect: bool = False
) -> tuple[Counter, list[threading.Thread]]:
    """`connections` threads, each on its own connection (with `reconnect`, a new one for each call),
    sending 7 MB messages as rank 3 until `stop`: the counts of calls and refusals (filled in as
    they go), and the threads."""
    from fedml.core.distributed.communication.message import Message

    msg = Message("result", 3, 0)
    msg.add_params("blob", "x" * BLOB)
    frame, meta = message_bytes(msg), (("x-fedml-moon-rank", "3"), ("authorization", f"Bearer {token}"))
    creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    counts, lock = Counter(), threading.Lock()

    def one_connection() -> None:
        while not stop.is_set():
            with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
                send = channel.stream_unary(f"/{SERVICE}/Send")
                while not stop.is_set():
                    try:
                        send(iter((frame,)), metadata=meta, timeout=5)
                        refused = 0
                    except grpc.RpcError:
                        refused = 1
                    with lock:
                        counts["calls"] += 1
                        counts["refused"] += refused
                    if reconnect:
                        break

    threads = [threading.Thread(target=one_connection) for _ in range(connections)]
    for thread in threads:
        thread.start()
    return counts, threads


def honest_silo(certs: Path, port: int):
    """Rank 1's own transport (a silo's), and its one 7 MB upload of a phase."""
    from fedml.core.distributed.communication.message import Message

    from fedml_moon.distributed.transport.grpc_client import GrpcClientTransport

    sec = GrpcSecurity(tls=True, ca=(certs / "ca.pem").read_bytes(), auth="token")
    sec.token = (certs / "silo-1.token").read_text().strip()
    silo = GrpcClientTransport(1, f"127.0.0.1:{port}", 64, timeout_s=60, security=sec)
    upload = Message("result", 1, 0)
    upload.add_params("blob", "y" * BLOB)
    return silo, upload


def run_phases(a: argparse.Namespace, ask, upload) -> tuple[list[dict], int]:
    """A phase every `a.phase_s` seconds (opened on the server, then the honest upload) for
    `a.seconds`; the server's answer at the end of each quarter, and the phases (with the first)."""
    quarters, start, phases = [], time.monotonic(), 1  # the first opened as the server started
    for q in range(1, 5):
        while time.monotonic() < start + q * a.seconds / 4:
            began, phases = time.monotonic(), phases + 1
            ask("phase")
            upload()
            time.sleep(max(0.0, a.phase_s - (time.monotonic() - began)))
        quarters.append(ask("sample"))
    return quarters, phases


def one_run(a: argparse.Namespace, certs: Path, flood: bool) -> dict:
    """The server's quarters (peak growth in MB) over a run of `a.seconds`, with or without the flood."""
    port = conformance.free_port()
    cmd = [sys.executable, __file__, "--serve", str(certs), str(port), "--window-kb", str(a.window_kb)]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stop, silo, counts, threads = threading.Event(), None, Counter(), []
    try:
        if server.stdout.readline().strip() != "listening":
            raise SystemExit("the server did not start; see its output above")

        def ask(what: str) -> dict:
            server.stdin.write(what + "\n")
            server.stdin.flush()
            return json.loads(server.stdout.readline())

        silo, upload = honest_silo(certs, port)
        before = ask("sample")
        if flood:
            token = (certs / "silo-3.token").read_text() if a.token == "valid" else "wrong"
            counts, threads = attack(certs, port, a.connections, stop, token, a.reconnect)
        quarters, phases = run_phases(a, ask, lambda: silo.send_message(upload))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        if silo is not None:
            silo.stop_receive_message()
        server.stdin.close()
        server.wait(30)
    growth = [(s["hwm"] - before["rss"]) / 1024 for s in quarters]
    return {"growth": growth, "last": quarters[-1], "counts": counts, "phases": phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--phase-s", type=float, default=5.0, help="a phase (round) of the run, seconds")
    ap.add_argument("--token", choices=("valid", "wrong"), default="valid")
    ap.add_argument("--window-kb", type=int, default=1024, help="the server's comm_args.receive_window_kb")
    ap.add_argument("--no-baseline", action="store_true", help="the flood's run only")
    ap.add_argument("--reconnect", action="store_true", help="a new connection for each call")
    ap.add_argument("--serve", nargs=2, metavar=("CERTS", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(Path(a.serve[0]), int(a.serve[1]), a.window_kb)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp) / "certs"
        make_certs(certs, silos=3, hosts=["127.0.0.1"])
        base = None if a.no_baseline else one_run(a, certs, flood=False)
        run = one_run(a, certs, flood=True)
    report(a, run, base)


def report(a: argparse.Namespace, run: dict, base: dict | None) -> None:
    """The quarters of each run, then the last line (see the module docstring)."""
    fmt = lambda xs, spec: ",".join(format(x, spec) for x in xs)  # noqa: E731
    growth, counts, last = run["growth"], run["counts"], run["last"]
    frames = last["frames"]
    line = (
        f"connections={a.connections} token={a.token} window_kb={a.window_kb} seconds={a.seconds:g} "
        f"phases={run['phases']} calls={counts['calls']} "
        f"refused={counts['refused']} taken={last['taken']} decoded={frames.get('decoded', 'n/a')} "
        f"refused_undecoded={frames.get('undecoded', 'n/a')} "
        f"refused_unread={frames.get('unread', 'n/a')} quarters_mb={fmt(growth, '.0f')}"
    )
    if base is not None:
        ratios = [g / max(b, 1.0) for g, b in zip(growth, base["growth"], strict=True)]
        line += f" baseline_quarters_mb={fmt(base['growth'], '.0f')} vs_baseline={fmt(ratios, '.1f')}"
    line += f" q4_vs_q1={growth[3] / max(growth[0], 1.0):.2f} peak_growth_mb={max(growth):.0f}"
    print(line)


if __name__ == "__main__":
    main()
