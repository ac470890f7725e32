"""What one rank can make the gRPC server hold: its peak memory while one token holder sends 7 MB
frames from many connections at once.

The server (TLS, tokens, 16 MB frame limit, as a run's) runs alone in a child process that does not
read its queue (a server busy training); this process opens `--connections` connections (gRPC's own
subchannel each) as rank 3, with its valid token or a wrong one, and sends a 7 MB message on each, one
call after another, for `--seconds`. The server refuses all but a few (per-rank slots, call rates,
the bound on messages in flight); the figure is how far its peak resident set (VmHWM) rose above its
resident set before the attack, against the bound the security page gives for what waits per sender
(16 messages and 2 x the frame limit + 1 MiB, 33 MiB here). Last line:
    connections=<n> token=<valid|wrong> window_kb=<kb> calls=<n> refused=<n> peak_growth_mb=<mb>
    after_growth_mb=<mb> documented_bound_mb=33 growth_vs_bound=<ratio>

Run: .venv/bin/python benchmarks/server_memory.py [--connections 64] [--seconds 8] [--token wrong]
[--window-kb 1024] (the server's comm_args.receive_window_kb; 0: gRPC's own window)
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedml_moon import conformance  # noqa: E402
from fedml_moon.distributed.transport.base import message_bytes  # noqa: E402
from fedml_moon.distributed.transport.grpc_common import SERVICE  # noqa: E402
from fedml_moon.security import load_token_table, make_certs  # noqa: E402

log = logging.getLogger("server_memory")
FRAME_LIMIT_MB = 16
BOUND_MB = 2 * FRAME_LIMIT_MB + 1


def memory_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def serve(certs: Path, port: int, window_kb: int) -> None:
    """The child: a run's gRPC server; one "rss hwm" line for each line read, until stdin ends."""
    from fedml_moon.distributed.transport.grpc_transport import GrpcSecurity, GrpcServerTransport

    read = lambda name: (certs / name).read_bytes()  # noqa: E731
    tokens = load_token_table(certs / "server-tokens.json")
    keys = {"ca": read("ca.pem"), "cert": read("server.pem"), "key": read("server.key")}
    sec = GrpcSecurity(tls=True, auth="token", tokens=tokens, **keys)
    server = GrpcServerTransport(
        "127.0.0.1", port, FRAME_LIMIT_MB, 3, sec, receive_timeout_s=30, receive_window_kb=window_kb
    )
    print("listening", flush=True)
    for _ in sys.stdin:
        rss, hwm = memory_kb()
        print(f"{rss} {hwm}", flush=True)
    server.stop_receive_message()


def attack(certs: Path, port: int, connections: int, seconds: float, token: str) -> dict[str, int]:
    """`connections` threads, each on its own connection, sending 7 MB messages as rank 3."""
    from fedml.core.distributed.communication.message import Message

    msg = Message("result", 3, 0)
    msg.add_params("blob", "x" * (7 << 20))
    frame, meta = message_bytes(msg), (("x-fedml-moon-rank", "3"), ("authorization", f"Bearer {token}"))
    creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    counts, lock, stop = {"calls": 0, "refused": 0}, threading.Lock(), time.monotonic() + seconds

    def one_connection() -> None:
        with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
            send = channel.stream_unary(f"/{SERVICE}/Send")
            while time.monotonic() < stop:
                try:
                    send(iter((frame,)), metadata=meta, timeout=5)
                    refused = 0
                except grpc.RpcError:
                    refused = 1
                with lock:
                    counts["calls"] += 1
                    counts["refused"] += refused

    threads = [threading.Thread(target=one_connection) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--token", choices=("valid", "wrong"), default="valid")
    ap.add_argument("--window-kb", type=int, default=1024, help="the server's comm_args.receive_window_kb")
    ap.add_argument("--serve", nargs=2, metavar=("CERTS", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(Path(a.serve[0]), int(a.serve[1]), a.window_kb)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        certs, port = Path(tmp) / "certs", conformance.free_port()
        make_certs(certs, silos=3, hosts=["127.0.0.1"])
        cmd = [sys.executable, __file__, "--serve", str(certs), str(port), "--window-kb", str(a.window_kb)]
        server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            if server.stdout.readline().strip() != "listening":
                raise SystemExit("the server did not start; see its output above")

            def ask() -> list[int]:
                server.stdin.write("\n")
                server.stdin.flush()
                return [int(x) for x in server.stdout.readline().split()]

            before = ask()
            token = (certs / "silo-3.token").read_text() if a.token == "valid" else "wrong"
            counts = attack(certs, port, a.connections, a.seconds, token)
            after = ask()
        finally:
            server.stdin.close()
            server.wait(30)
    peak, kept = (after[1] - before[0]) / 1024, (after[0] - before[0]) / 1024
    print(
        f"connections={a.connections} token={a.token} window_kb={a.window_kb} calls={counts['calls']} "
        f"refused={counts['refused']} "
        f"peak_growth_mb={peak:.0f} after_growth_mb={kept:.0f} documented_bound_mb={BOUND_MB} "
        f"growth_vs_bound={peak / BOUND_MB:.1f}"
    )


if __name__ == "__main__":
    main()
