"""A silo of a real run that holds valid credentials and attacks its server (tests/test_hostile_silo.py).

    python tests/support/hostile_silo.py --cf CONFIG --set KEY=VALUE ... --rank R --mode attack|churn|honest

Every round it answers TRAIN with its honest result (the model it was sent, back), preceded in
`attack` mode by hostile messages drawn from tests/support/hostile.py (seeded by the round) and the raw frames
found on the wire (a 5,000-digit JSON integer, random bytes, a pickle); in `churn` mode (gRPC) a
thread of its own opens Subscribe calls for its rank's frames on a second connection without pause,
each cancelled at once, from its READY (once it is in the run) to its end. It answers CHECKPOINT and
FINISH as a silo does and sends heartbeats. It exits 0 on FINISH, 1 on ABORT, 2 after --timeout-s.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import queue
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedml_moon.adapters.run import build_base, partition_claims  # noqa: E402
from fedml_moon.config.load import load_config  # noqa: E402
from fedml_moon.distributed import managers as m  # noqa: E402
from fedml_moon.distributed.deploy import make_transport, shared_config, worker_count  # noqa: E402
from fedml_moon.registry import get_algorithm  # noqa: E402
from tests.support.hostile import Target, honest_item, hostile_messages, huge_int_frame  # noqa: E402

log = logging.getLogger("hostile")


class Inbox:
    def __init__(self) -> None:
        self.got: queue.Queue = queue.Queue()

    def receive_message(self, kind: str, msg: m.Message) -> None:
        self.got.put(msg)


def send(transport, kind: str, **params) -> None:
    msg = m.Message(kind, transport.rank, 0)
    for key, value in params.items():
        msg.add_params(key, value)
    try:
        transport.send_message(msg)
    except Exception as err:  # the server may refuse a call outright (gRPC): that is the point
        log.info("%s refused by the transport: %s", kind, str(err)[:200])


def raw_frames() -> list[bytes]:
    return [huge_int_frame(), os.urandom(512), pickle.dumps({"x": 1}), b"FMC1"]


def churn(transport, rank: int, stop: threading.Event) -> None:
    """Subscribe calls of `rank` on a connection of their own, each cancelled at once, until `stop`.
    The thread runs at the lowest priority (Linux's nice values are per thread): an attacker's CPU is
    its own machine's, and here it shares the server's and the honest silos' cores."""
    from fedml_moon.distributed.transport.grpc_common import RANK, SERVICE, channel_options

    os.nice(19)

    channel = transport._channel(transport.server_address, channel_options(16))
    subscribe, calls = channel.stream_stream(f"/{SERVICE}/Subscribe"), 0
    while not stop.is_set() and calls < 500_000:
        subscribe(iter((RANK.pack(rank),)), metadata=transport.metadata).cancel()
        calls += 1
        if calls % 5_000 == 0:
            log.info("churned %d Subscribe calls", calls)
    channel.close()
    log.info("churned %d Subscribe calls", calls)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cf", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--mode", choices=("attack", "churn", "honest"), required=True)
    ap.add_argument("--timeout-s", type=float, default=240)
    ap.add_argument("--out", required=True, help="a folder of its own")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hostile %(message)s")
    cfg = load_config(a.cf, a.set)
    claim = partition_claims(build_base(cfg, Path(a.out)))[a.rank - 1]  # what it truly holds
    samples = claim["samples"]
    terms, shared = get_algorithm(cfg.train_args.algorithm).client.terms, shared_config(cfg)
    transport = make_transport(cfg, a.rank, worker_count(cfg, None))
    inbox = Inbox()
    transport.add_observer(inbox)
    threading.Thread(target=transport.handle_receive_message, daemon=True).start()
    hello = {"config": shared, "explicit": [], "fresh_parties": [], "process": f"h{os.getpid()}"}
    send(transport, m.HELLO, parties=[a.rank - 1], **hello)
    stop = threading.Event()
    churner = threading.Thread(target=churn, args=(transport, a.rank, stop), daemon=True)
    deadline, beat = time.monotonic() + a.timeout_s, 0.0
    try:
        while time.monotonic() < deadline:
            if time.monotonic() - beat >= cfg.comm_args.heartbeat_s:
                send(transport, m.HEARTBEAT)
                beat = time.monotonic()
            try:
                msg = inbox.got.get(timeout=0.5)
            except queue.Empty:
                continue
            kind = msg.get_type()
            log.info("got %s", kind)
            if kind == m.REJOIN:
                send(transport, m.HELLO, parties=[a.rank - 1], **hello)
            elif kind == m.WELCOME:
                send(transport, m.READY, claims=[{"party": a.rank - 1, "claim": claim}])
                if a.mode == "churn" and churner.ident is None:  # in the run: now it deafens itself
                    churner.start()
            elif kind == m.TRAIN:
                task, round_idx = msg.get("tasks")[0], msg.get("round")
                other = 0 if a.rank != 1 else 1
                target = Target(
                    round_idx, a.rank, task["party"], other, task["payload"]["model"], samples, terms, shared
                )
                if a.mode == "attack":
                    for attack_kind, params in hostile_messages(random.Random(round_idx), target, 14):
                        send(transport, attack_kind, **params)
                    for frame in raw_frames():
                        try:
                            transport.send_bytes(0, frame)
                        except Exception as err:
                            log.info("a raw frame refused: %s", str(err)[:200])
                    time.sleep(1.0)  # the server's bound on messages in flight drops a burst's excess
                send(transport, m.RESULT, round=round_idx, results=[honest_item(target)])
            elif kind == m.CHECKPOINT:
                send(transport, m.CHECKPOINTED, round=msg.get("round"))
            elif kind == m.FINISH:
                send(transport, m.BYE)
                return 0
            elif kind == m.ABORT and any(
                said in str(msg.get("reason"))
                for said in ("config differs from the server's", "claims are refused")
            ):
                log.info("its hostile HELLO was refused: %s", str(msg.get("reason"))[:200])
            elif kind == m.ABORT:
                log.info("aborted: %s", msg.get("reason"))
                return 1
        return 2
    finally:
        stop.set()
        if churner.is_alive():
            churner.join(timeout=10)
        transport.stop_receive_message()


if __name__ == "__main__":
    sys.exit(main())
