"""A silo of a real run that holds valid credentials and attacks its server (tests/test_hostile_silo.py).

    python tests/hostile_silo.py --cf CONFIG --set KEY=VALUE ... --rank R --mode attack|bye

It says a valid HELLO, answers every TRAIN with the attacks found on the wire (`attack`), or with a
BYE (`bye`: the same silo leaving, for the run to compare with), answers CHECKPOINT and FINISH as a
silo does, and sends heartbeats. It exits 0 on FINISH, 1 on ABORT, 2 after --timeout-s.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import pickle
import queue
import sys
import threading
import time
from pathlib import Path

import torch
from fedml.core.distributed.communication.message import Message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedml_moon.adapters.run import build_base, party_samples  # noqa: E402
from fedml_moon.config import load_config  # noqa: E402
from fedml_moon.distributed import managers as m  # noqa: E402
from fedml_moon.distributed.deploy import make_transport, shared_config, worker_count  # noqa: E402
from tests.test_codec import huge_int_frame  # noqa: E402

log = logging.getLogger("hostile")


class Inbox:
    def __init__(self) -> None:
        self.got: queue.Queue = queue.Queue()

    def receive_message(self, kind: str, msg: Message) -> None:
        self.got.put(msg)


def send(transport, kind: str, **params) -> None:
    msg = Message(kind, transport.rank, 0)
    for key, value in params.items():
        msg.add_params(key, value)
    try:
        transport.send_message(msg)
    except Exception as err:  # the server may refuse a call outright (gRPC): that is the point
        log.info("%s refused by the transport: %s", kind, str(err)[:200])


def attacks(round_idx: int, task: dict, samples: int) -> list[tuple[str, dict]]:
    """Each attack class, on the party the round gave this silo."""
    party, model = task["party"], task["payload"]["model"]
    item = {"party": party, "n": samples, "upload": {"model": model, "party_id": party}}
    constant = {k: torch.full_like(v, 7.0) if v.is_floating_point() else v for k, v in model.items()}
    poisoned = {k: torch.full_like(v, math.nan) if v.is_floating_point() else v for k, v in model.items()}
    result = lambda **kw: (m.RESULT, {"round": round_idx, "results": [{**item, **kw}]})  # noqa: E731
    return [
        result(n=math.nan),
        result(n=10**30, upload={"model": constant, "party_id": party}),
        result(n=-299),
        result(n=samples + 1),
        result(party=party + 1000),
        result(upload={"model": dict(list(model.items())[:1]), "party_id": party}),
        result(upload={"model": model, "party_id": party + 1}),
        result(upload={"model": poisoned, "party_id": party, "extra": torch.ones(3)}),
        (m.RESULT, {"round": round_idx, "results": None}),
        (m.HELLO, {"parties": [party], "config": [1], "explicit": [], "fresh_parties": [], "process": "x"}),
        (m.REPORT, {"round": round_idx, "reports": [{"party_id": party, "local_test_acc": 7.0}]}),
        (m.CHECKPOINTED, {"round": -1}),
        (m.TICK, {}),
        ("bogus", {"x": 1}),
    ]


def raw_frames() -> list[bytes]:
    return [huge_int_frame(), os.urandom(512), pickle.dumps({"x": 1}), b"FMC1"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cf", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--mode", choices=("attack", "bye"), required=True)
    ap.add_argument("--timeout-s", type=float, default=240)
    ap.add_argument("--out", required=True, help="a folder of its own")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hostile %(message)s")
    cfg = load_config(a.cf, a.set)
    samples = party_samples(build_base(cfg, Path(a.out)))[a.rank - 1]  # its party's true count
    transport = make_transport(cfg, a.rank, worker_count(cfg, None))
    inbox = Inbox()
    transport.add_observer(inbox)
    threading.Thread(target=transport.handle_receive_message, daemon=True).start()
    hello = {"config": shared_config(cfg), "explicit": [], "fresh_parties": [], "process": f"h{os.getpid()}"}
    send(transport, m.HELLO, parties=[a.rank - 1], **hello)
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
            elif kind == m.TRAIN and a.mode == "bye":
                send(transport, m.BYE)
            elif kind == m.TRAIN:
                for attack_kind, params in attacks(msg.get("round"), msg.get("tasks")[0], samples):
                    send(transport, attack_kind, **params)
                for frame in raw_frames():
                    try:
                        transport.send_bytes(0, frame)
                    except Exception as err:
                        log.info("a raw frame refused: %s", str(err)[:200])
            elif kind == m.CHECKPOINT:
                send(transport, m.CHECKPOINTED, round=msg.get("round"))
            elif kind == m.FINISH:
                send(transport, m.BYE)
                return 0
            elif kind == m.ABORT:
                log.info("aborted: %s", msg.get("reason"))
                return 1
        return 2
    finally:
        transport.stop_receive_message()


if __name__ == "__main__":
    sys.exit(main())
