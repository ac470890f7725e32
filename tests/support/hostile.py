"""Well-formed but hostile messages a silo with valid credentials can send its server: the right keys,
types and shapes, filled with values the server must refuse (extreme, negative, colliding with names
the server writes, another silo's party, out of round, repeated, of the wrong phase). Drawn from a
`random.Random`, so that an in-process property test (hypothesis hands it the Random) and a real silo
over gRPC or MQTT + S3 (seeded) draw from the same generator.

Every message drawn here is one the server's design refuses: a run that receives it must end with the
model and records of the same run without it (tests/test_hostile_rounds.py, tests/test_hostile_silo.py).
A raw frame the codec must refuse with its own error (`huge_int_frame`) goes beside them.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedml_moon.core.validate import SERVER_FIELDS
from fedml_moon.distributed import protocol as p


@dataclass
class Target:
    """What the attacker knows in a round: its rank and party, another silo's party, the model it was
    sent, its party's true sample count, the algorithm's terms, the run's shared config."""

    round_idx: int
    rank: int
    party: int
    other: int
    model: dict
    samples: int
    terms: tuple[str, ...]
    config: dict


def honest_item(t: Target, metrics: dict | None = None) -> dict:
    """The attacker's honest result record: the model it was sent, back, with its terms' metrics."""
    upload = {"model": dict(t.model), "party_id": t.party, "metrics": dict(metrics or {"loss": 1.0})}
    return {"party": t.party, "n": t.samples, "upload": upload}


def _result(t: Target, round_idx: int | None = None, **item) -> tuple[str, dict]:
    return p.RESULT, {"round": t.round_idx if round_idx is None else round_idx, "results": [item]}


def _wrong_n(rng: random.Random, t: Target) -> tuple[str, dict]:
    n = rng.choice([t.samples + 1, t.samples - 1, 0, -1, 2**53 + 1, 10**30, float(t.samples), True])
    return _result(t, **{**honest_item(t), "n": n})


def _foreign_party(rng: random.Random, t: Target) -> tuple[str, dict]:
    item = honest_item(t)
    party = rng.choice([t.other, t.party + 1000, 10**6, -1])
    item["upload"]["party_id"] = rng.choice([party, t.party])
    return _result(t, **{**item, "party": party})


def _out_of_round(rng: random.Random, t: Target) -> tuple[str, dict]:
    return _result(
        t, rng.choice([t.round_idx - 1, t.round_idx + 1, t.round_idx + 7, 10**7]), **honest_item(t)
    )


def _colliding_metric(rng: random.Random, t: Target) -> tuple[str, dict]:
    name = rng.choice(sorted(SERVER_FIELDS - {"loss"}) + ["undeclared", "train_acc", "ce_"])
    value = rng.choice([0.99, -1.0, 1e14, 7])
    return _result(t, **honest_item(t, {"loss": 1.0, name: value}))


def _huge_integer_metric(rng: random.Random, t: Target) -> tuple[str, dict]:
    term = rng.choice(["loss", *t.terms])
    return _result(t, **honest_item(t, {"loss": 1.0, term: rng.choice([1, -1]) * 10 ** rng.randint(16, 600)}))


def _tampered_model(rng: random.Random, t: Target) -> tuple[str, dict]:
    item, model = honest_item(t), dict(t.model)
    key = rng.choice(sorted(model))
    how = rng.choice(["drop", "extra", "shape", "dtype", "party_id", "field"])
    if how == "drop":
        model.pop(key)
    elif how == "extra":
        model[f"{key}_"] = torch.zeros(2)
    elif how == "shape":
        model[key] = torch.zeros(*model[key].shape, 2)
    elif how == "dtype":
        model[key] = model[key].double() if model[key].is_floating_point() else model[key].float()
    item["upload"]["model"] = model
    if how == "party_id":
        item["upload"]["party_id"] = rng.choice([t.other, str(t.party), float(t.party)])
    if how == "field":
        item["upload"][rng.choice(["extra", "prototypes", "c", "personal"])] = torch.ones(3)
    return _result(t, **item)


def _many_records(rng: random.Random, t: Target) -> tuple[str, dict]:
    records = [honest_item(t)] * rng.randint(2, 4) + (
        [honest_item(t) | {"party": t.other}] if rng.random() < 0.5 else []
    )
    return p.RESULT, {"round": t.round_idx, "results": records}


def _hello(rng: random.Random, t: Target) -> tuple[str, dict]:
    """A HELLO from a new process id (a restarted silo, again and again), or with settings of its own."""
    explicit, config = [], dict(t.config)
    if rng.random() < 0.3 and config:
        key = rng.choice(sorted(config))
        config[key], explicit = ["not", "the", "server's"], [key]
    params = {"parties": [t.party], "config": config, "explicit": explicit}
    params |= {"fresh_parties": rng.choice([[], [t.other]]), "process": f"x{rng.randrange(10**9)}"}
    return p.HELLO, params


def _ready(rng: random.Random, t: Target) -> tuple[str, dict]:
    """A READY that claims other holdings than its party's fixed claim: another count (every time a
    new one), one beyond any cap, another party's, a malformed claim, or its party twice."""
    claim = {"samples": t.samples, "test_samples": 1, "classes": []}
    bad = rng.choice(
        [
            {**claim, "samples": rng.choice([t.samples + rng.randint(1, 10**6), 10**9, 0, -1, True, 3.5])},
            {**claim, "classes": rng.choice([[10**6], [2, 1], [0, 0], "all"])},
            {**claim, "weight": 10**9},
        ]
    )
    items = rng.choice(
        [
            [{"party": t.party, "claim": bad}],
            [{"party": t.other, "claim": claim}],
            [{"party": t.party, "claim": bad}, {"party": t.party, "claim": claim}],
        ]
    )
    return p.READY, {"claims": items}


def _wrong_phase(rng: random.Random, t: Target) -> tuple[str, dict]:
    return rng.choice(
        [
            (p.REPORT, {"round": t.round_idx, "reports": [{"party_id": t.party, "local_test_acc": 0.5}]}),
            (p.CHECKPOINTED, {"round": rng.choice([t.round_idx, t.round_idx + 1, 0])}),
            (p.TICK, {}),
            (p.KEYS, {"round": t.round_idx, "keys": []}),
            (p.MASKED, {"round": t.round_idx, "items": []}),
        ]
    )


def _not_a_type(rng: random.Random, t: Target) -> tuple[object, dict]:
    kind = rng.choice([["result"], {"t": "result"}, 7, None, "", "bogus", "RESULT", "result "])
    return kind, {"round": t.round_idx, "results": [honest_item(t)]}


KINDS: dict[str, Callable[[random.Random, Target], tuple[object, dict]]] = {
    "wrong_n": _wrong_n,
    "foreign_party": _foreign_party,
    "out_of_round": _out_of_round,
    "colliding_metric": _colliding_metric,
    "huge_integer_metric": _huge_integer_metric,
    "tampered_model": _tampered_model,
    "many_records": _many_records,
    "hello": _hello,
    "ready": _ready,
    "wrong_phase": _wrong_phase,
    "not_a_type": _not_a_type,
}


def hostile_messages(rng: random.Random, t: Target, count: int) -> list[tuple[object, dict]]:
    """`count` hostile messages, each of a kind drawn at random (every kind once first, when count
    allows)."""
    kinds = sorted(KINDS)
    rng.shuffle(kinds)
    chosen = (kinds + [rng.choice(kinds) for _ in range(count)])[:count]
    return [KINDS[kind](rng, t) for kind in chosen]


def huge_int_frame(digits: int = 5000) -> bytes:
    """A well-framed message whose JSON sender is an integer of `digits` digits (Python refuses to
    convert more than 4,300 with a ValueError of its own)."""
    body = b'{"v": 1, "tree": {"msg_type": "result", "sender": ' + b"7" * digits + b', "receiver": 0}}'
    return struct.pack("<4sQ", b"FMC1", len(body)) + body
