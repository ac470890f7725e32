"""Honest silos' pace under a flood of valid frames: one token holder (rank 3) sends valid frames that
are dear to decode (trees of many small numbers) from many connections, while the server runs rounds
with the honest ranks 1 and 2.

The server (TLS, tokens, 16 MB frames) runs alone in a child process pinned to CPU 0; its main thread
runs `--rounds` rounds: it sends each honest rank a TRAIN, takes both RESULTs (100 KB), then spends
`--work-ms` of Python work (its aggregation) and starts the next. The honest silos run in this process,
the flood in another (both pinned to CPU 1), warmed up `--warmup-s` seconds before the rounds start.
A round's time with the flood against the same run without it (medians and means), and rank 3's
frames (decoded, refused undecoded, refused unread). Last line:
    connections=<n> frame_kb=<kb> rounds=<n> base_ms=<median> flood_ms=<median> median_ratio=<r>
    mean_ratio=<r> max_ms=<ms> decoded=<n> undecoded=<n> unread=<n>

Run: .venv/bin/python benchmarks/honest_pace.py [--connections 64] [--frame-kb 250] [--rounds 40]
[--work-ms 50] [--warmup-s 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from fedml_moon import conformance  # noqa: E402  (before FedML's own modules)
from fedml_moon.distributed.transport.base import message_bytes  # noqa: E402
from fedml_moon.distributed.transport.grpc_common import SERVICE, GrpcSecurity  # noqa: E402
from fedml_moon.security import load_token_table, make_certs  # noqa: E402

log = logging.getLogger("honest_pace")
RESULT_KB = 100


def pin(cpu: int) -> None:
    """Run this process on `cpu` only, where the machine has it."""
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def dear_frame(rank: int, kb: int) -> bytes:
    """A valid RESULT of rank `rank`, about `kb` KB of lists of floats (dear to decode)."""
    from fedml.core.distributed.communication.message import Message

    msg = Message("result", rank, 0)
    lists = max(1, kb * 1000 // 600)  # 100 floats: about 600 bytes
    msg.add_params("model", {f"w{i}": [float(j) for j in range(100)] for i in range(lists)})
    return message_bytes(msg)


def serve(certs: Path, port: int, rounds: int, work_ms: float) -> None:
    """The child: the server; after `go` on stdin, `rounds` rounds; one JSON line of their times."""
    from fedml.core.distributed.communication.message import Message

    from fedml_moon.distributed.transport.grpc_transport import GrpcServerTransport

    pin(0)
    logging.basicConfig(level=logging.ERROR)  # the refusals' lines
    read = lambda name: (certs / name).read_bytes()  # noqa: E731
    sec = GrpcSecurity(tls=True, auth="token", tokens=load_token_table(certs / "server-tokens.json"))
    sec.ca, sec.cert, sec.key = read("ca.pem"), read("server.pem"), read("server.key")
    server = GrpcServerTransport("127.0.0.1", port, 16, 3, sec, receive_timeout_s=30)
    server.expect({1: rounds, 2: rounds, 3: 0})
    print("listening", flush=True)
    sys.stdin.readline()
    times: list[float] = []
    state = {"began": 0.0, "got": set()}

    def start() -> None:
        state["began"], state["got"] = time.monotonic(), set()
        for rank in (1, 2):
            server.send_message(Message("train", 0, rank))

    class Rounds:
        def receive_message(self, kind, msg) -> None:
            if msg.get_sender_id() not in (1, 2) or kind != "result":
                return  # the flood's: dropped, as a run's server drops a late message
            state["got"].add(msg.get_sender_id())
            if state["got"] == {1, 2}:
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < work_ms / 1000:
                    pass  # the aggregation, holding the GIL
                times.append(time.monotonic() - state["began"])
                if len(times) >= rounds:
                    server.stop_receive_message()
                else:
                    start()

    server.add_observer(Rounds())
    start()
    server.handle_receive_message()
    frames = {what: n for (rank, what), n in server.frames.items() if rank == 3}
    print(json.dumps({"times": times, "frames": frames}), flush=True)


def flood(certs: Path, port: int, connections: int, kb: int) -> None:
    """The child: rank 3 sends `kb` KB frames from `connections` connections until stdin closes."""
    pin(1)
    frame, token = dear_frame(3, kb), (certs / "silo-3.token").read_text()
    meta = (("x-fedml-moon-rank", "3"), ("authorization", f"Bearer {token}"))
    creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]

    def one() -> None:
        with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
            send = channel.stream_unary(f"/{SERVICE}/Send")
            while True:
                try:
                    send(iter((frame,)), metadata=meta, timeout=5)
                except grpc.RpcError:
                    pass

    for _ in range(connections):
        threading.Thread(target=one, daemon=True).start()
    sys.stdin.read()


def honest_silo(certs: Path, port: int, rank: int):
    """Rank `rank`'s own transport, answering each TRAIN with a 100 KB RESULT."""
    from fedml.core.distributed.communication.message import Message

    from fedml_moon.distributed.transport.grpc_client import GrpcClientTransport

    sec = GrpcSecurity(tls=True, ca=(certs / "ca.pem").read_bytes(), auth="token")
    sec.token = (certs / f"silo-{rank}.token").read_text().strip()
    silo = GrpcClientTransport(rank, f"127.0.0.1:{port}", 64, timeout_s=60, security=sec)
    upload = Message("result", rank, 0)
    upload.add_params("blob", "y" * (RESULT_KB << 10))

    class Answer:
        def receive_message(self, kind, msg) -> None:
            silo.send_message(upload)

    silo.add_observer(Answer())
    threading.Thread(target=silo.handle_receive_message, daemon=True).start()
    return silo


def one_run(a: argparse.Namespace, certs: Path, flooded: bool) -> dict:
    """The rounds' times and rank 3's frame counts, with or without the flood."""
    port, me = conformance.free_port(), [sys.executable, __file__]
    cmd = [*me, "--serve", str(certs), str(port), "--rounds", str(a.rounds), "--work-ms", str(a.work_ms)]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    silos, attacker = [], None
    try:
        if server.stdout.readline().strip() != "listening":
            raise SystemExit("the server did not start; see its output above")
        silos = [honest_silo(certs, port, rank) for rank in (1, 2)]
        if flooded:
            cmd = [*me, "--flood", str(certs), str(port), "--connections", str(a.connections)]
            attacker = subprocess.Popen([*cmd, "--frame-kb", str(a.frame_kb)], stdin=subprocess.PIPE)
            time.sleep(a.warmup_s)
        server.stdin.write("go\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline())
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait(30)
        for silo in silos:
            silo.stop_receive_message()
        server.stdin.close()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--frame-kb", type=int, default=250, help="the flood's frames (16 MB at most)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--work-ms", type=float, default=50.0, help="the server's aggregation, a round")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="the flood before the rounds start")
    ap.add_argument("--serve", nargs=2, metavar=("CERTS", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--flood", nargs=2, metavar=("CERTS", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(Path(a.serve[0]), int(a.serve[1]), a.rounds, a.work_ms)
    if a.flood:
        return flood(Path(a.flood[0]), int(a.flood[1]), a.connections, a.frame_kb)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    pin(1)
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp) / "certs"
        make_certs(certs, silos=3, hosts=["127.0.0.1"])
        base, run = one_run(a, certs, False), one_run(a, certs, True)
    b, f, frames = base["times"], run["times"], run["frames"]
    print(
        f"connections={a.connections} frame_kb={a.frame_kb} rounds={a.rounds} "
        f"base_ms={statistics.median(b) * 1000:.0f} flood_ms={statistics.median(f) * 1000:.0f} "
        f"median_ratio={statistics.median(f) / statistics.median(b):.2f} "
        f"mean_ratio={statistics.mean(f) / statistics.mean(b):.2f} max_ms={max(f) * 1000:.0f} "
        f"decoded={frames.get('decoded', 0)} undecoded={frames.get('undecoded', 0)} "
        f"unread={frames.get('unread', 0)}"
    )


if __name__ == "__main__":
    main()
