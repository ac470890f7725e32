"""Every message of the plugin's protocol (see managers.py), declared once: its fields, their types
and ranges. `_Manager.receive_message` checks each message against its declaration before any
handler runs; a message that does not match is refused with the sender and the field named.

What a payload's tensors must be (names, shapes, dtypes: the whole model) depends on the algorithm
and the round, so the fields marked `payload` are checked where they are bound to a party: the server
checks each upload against its algorithm's `upload_spec` and each report against `personal_spec`
(`core.validate`), and that the party is one this round gave the sender, with the sample count the
server fixed for it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fedml_moon.distributed.run_identity import RUN_KEY

HELLO, WELCOME, TRAIN, RESULT, EVAL, REPORT = "hello", "welcome", "train", "result", "eval", "report"
FINISH, ABORT, BYE, ERROR, TICK = "finish", "abort", "bye", "error", "tick"
CHECKPOINT, CHECKPOINTED, HEARTBEAT = "checkpoint", "checkpointed", "heartbeat"
REJOIN = "rejoin"  # server -> a worker it has not welcomed (a restarted server): say HELLO now
READY = "ready"  # worker -> server, once its data are built: what each of its parties holds (claims)
REFUSE = "refuse"  # worker -> server, instead of READY: it refuses its own data (distributed/silo/refusal.py)
REFUSAL_KINDS = {
    "agreement": "its data do not fit the run's agreement",
    "unreadable": "a file of its data cannot be read",
    "missing": "its data are missing",
    "split": "its data cannot be split as the run says",
    "changed": "its data differ from those it read earlier in this run",
}
"""The kinds of problem a site may say it refuses its data for: nothing else of them leaves the site."""


def refusal_text(kind: str, key: str | None) -> str:
    """What a REFUSE says: `its data do not fit the run's agreement (data_args.classes)`."""
    return REFUSAL_KINDS[kind] + (f" ({key})" if key else "")


ENVELOPE = ("msg_type", "sender", "receiver")  # FedML's Message fields, checked by the transports

Check = Callable[[Any], "str | None"]  # None, or why the value does not fit (" is ...", "[3] is ...")
MAX_ID = 10**6  # party ids and counts of list items
MAX_ROUND = 10**7
MAX_TEXT = 100_000


def _kind(value: Any) -> str:
    return type(value).__name__


def integer(lo: int, hi: int) -> Check:
    """An int (not a bool) in [lo, hi]."""

    def check(value: Any) -> str | None:
        if type(value) is not int:
            return f" is a {_kind(value)}, not an integer"
        return None if lo <= value <= hi else f" is {value}, not in [{lo}, {hi}]"

    return check


def number(lo: float, hi: float) -> Check:
    """A finite int or float (not a bool) in [lo, hi]."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f" is a {_kind(value)}, not a number"
        return None if math.isfinite(value) and lo <= value <= hi else f" is {value!r}, not in [{lo}, {hi}]"

    return check


def text(max_len: int) -> Check:
    """A str of at most `max_len` characters."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f" is a {_kind(value)}, not a string"
        return None if len(value) <= max_len else f" has {len(value)} characters, more than {max_len}"

    return check


def optional(inner: Check) -> Check:
    """None, or what `inner` accepts."""
    return lambda value: None if value is None else inner(value)


def list_of(item: Check, max_items: int = MAX_ID) -> Check:
    """A list of at most `max_items` values that `item` accepts."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return f" is a {_kind(value)}, not a list"
        if len(value) > max_items:
            return f" has {len(value)} items, more than {max_items}"
        for i, v in enumerate(value):
            if (problem := item(v)) is not None:
                return f"[{i}]{problem}"
        return None

    return check


def record(fields: Mapping[str, Check], optional_keys: frozenset[str] = frozenset()) -> Check:
    """A dict with exactly the keys of `fields` (those in `optional_keys` may be absent)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return f" is a {_kind(value)}, not a record"
        if problem := _keys_problem(value, fields, optional_keys):
            return problem
        for key, inner in fields.items():
            if key in value and (problem := inner(value[key])) is not None:
                return f".{key}{problem}"
        return None

    return check


def _keys_problem(value: Mapping, fields: Mapping[str, Check], optional_keys: frozenset[str]) -> str | None:
    extra = [str(k)[:40] for k in value if k not in fields]
    missing = [k for k in fields if k not in value and k not in optional_keys]
    if not extra and not missing:
        return None
    said = [f"has unexpected fields {extra[:5]}"] if extra else []
    return " " + " and ".join(said + ([f"lacks {missing}"] if missing else []))


def json_value(depth: int = 6) -> Check:
    """A JSON value (a setting): scalars, and lists / dicts of them nested at most `depth` deep."""

    def check(value: Any) -> str | None:
        if value is None or isinstance(value, (bool, int, float)):
            return None
        if isinstance(value, str):
            return text(MAX_TEXT)(value)
        if depth > 0 and isinstance(value, (list, tuple)):
            return list_of(json_value(depth - 1), 10_000)(list(value))
        if depth > 0 and isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            inner = json_value(depth - 1)
            return next((f".{k}{p}" for k, v in value.items() if (p := inner(v)) is not None), None)
        return f" is a {_kind(value)}, not a setting's value"

    return check


def payload(value: Any) -> str | None:
    """A dict of tensors and values; its tensors are checked against the algorithm's spec later."""
    return None if isinstance(value, Mapping) else f" is a {_kind(value)}, not a payload"


def settings(value: Any) -> str | None:
    """A run's shared settings: {"section.key": value}."""
    if not isinstance(value, Mapping) or len(value) > 10_000:
        return f" is a {_kind(value)}, not a dict of settings"
    for key, v in value.items():
        if not isinstance(key, str) or len(key) > 200:
            return f" has a key {str(key)[:40]!r} that is not a setting's name"
        if (problem := json_value()(v)) is not None:
            return f"[{key!r}]{problem}"
    return None


def hex_text(max_bytes: int) -> Check:
    """Bytes written as a hex string of at most `max_bytes` bytes (keys, ciphertexts, share values)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or len(value) > 2 * max_bytes or len(value) % 2:
            return f" is not a hex string of at most {max_bytes} bytes"
        try:
            bytes.fromhex(value)
        except ValueError:
            return " is not a hex string"
        return None

    return check


def int_tensor(value: Any) -> str | None:
    """A 1-D int32 or int64 tensor (a masked vector; its length is checked against the round's)."""
    if (
        not isinstance(value, torch.Tensor)
        or value.dim() != 1
        or value.dtype not in (torch.int32, torch.int64)
    ):
        return f" is a {_kind(value)}, not a 1-D int32 / int64 tensor"
    return None


PARTY, ROUND = integer(0, MAX_ID), integer(0, MAX_ROUND)
SAMPLES = integer(1, 2**53)  # the server's own count for the party is checked when the result is bound
SESSION = text(64)


def run_key(value: Any) -> str | None:
    """A run's identity as the server names it (`run_identity.RUN_KEY`: 8 to 32 lowercase hex digits),
    the name of a folder at each site: nothing else passes."""
    if isinstance(value, str) and RUN_KEY.fullmatch(value):
        return None
    return " is not a run's key (8 to 32 lowercase hex digits)"


def one_of(choices: Mapping[str, Any]) -> Check:
    """One of the keys of `choices`."""
    return lambda value: (
        None if isinstance(value, str) and value in choices else f" is not one of {sorted(choices)}"
    )


def setting_name(value: Any) -> str | None:
    """The name of one of the run's settings (`section_args.name`, a field of the config's schema)."""
    if not isinstance(value, str) or value not in _settings():
        return " is not the name of one of the run's settings (section_args.name)"
    return None


@functools.cache
def _settings() -> frozenset[str]:
    from fedml_moon.config.schema import SECTIONS

    return frozenset(f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls))


# secure aggregation's extra rounds (distributed/server/secure.py): keys, shares, masked inputs, unmasking
KEYS, ROSTER, SHARES, MASK, MASKED, UNMASK, UNMASKED = (
    "sa_keys",
    "sa_roster",
    "sa_shares",
    "sa_mask",
    "sa_masked",
    "sa_unmask",
    "sa_unmasked",
)
PUBLIC_KEYS = record({"party": PARTY, "c_pk": hex_text(32), "s_pk": hex_text(32), "b_commit": hex_text(32)})
SHARE_VALUES = list_of(record({"of": PARTY, "x": integer(1, MAX_ID), "y": hex_text(16)}))

HELD, OPEN = "sa_held", "sa_open"  # a buffered run's secure sums (distributed/server/buffered_secure.py)

SECURE_SCHEMAS: dict[str, dict[str, Check]] = {
    # worker -> server
    HELD: {"round": ROUND, "parties": list_of(record({"party": PARTY, "n": SAMPLES}))},
    KEYS: {"round": ROUND, "keys": list_of(PUBLIC_KEYS)},
    SHARES: {
        "round": ROUND,
        "shares": list_of(record({"sender": PARTY, "receiver": PARTY, "ct": hex_text(1024)})),
    },
    MASKED: {
        "round": ROUND,
        "items": list_of(record({"party": PARTY, "vector": int_tensor, "accused": list_of(PARTY)})),
    },
    UNMASKED: {
        "round": ROUND,
        "items": list_of(record({"party": PARTY, "b": SHARE_VALUES, "s": SHARE_VALUES})),
    },
    # server -> worker
    OPEN: {"round": ROUND, "parties": list_of(record({"party": PARTY, "version": ROUND}))},
    ROSTER: {
        "round": ROUND,
        "participants": integer(1, MAX_ID),
        "digests": list_of(record({"party": PARTY, "digest": hex_text(32)})),
        "rosters": list_of(record({"party": PARTY, "keys": list_of(PUBLIC_KEYS)})),
    },
    MASK: {
        "round": ROUND,
        "tasks": list_of(
            record(
                {
                    "party": PARTY,
                    "plan": json_value(),
                    "inbox": list_of(record({"sender": PARTY, "ct": hex_text(1024)})),
                }
            )
        ),
    },
    UNMASK: {
        "round": ROUND,
        "survivors": list_of(PARTY),
        "dropped": list_of(PARTY),
        "parties": list_of(PARTY),
    },
}

SCHEMAS: dict[str, dict[str, Check]] = {
    # worker -> server
    HELLO: {
        "parties": list_of(PARTY),
        "config": settings,
        "explicit": list_of(text(200), 10_000),
        "fresh_parties": list_of(PARTY),
        "process": SESSION,
    },
    READY: {"claims": list_of(record({"party": PARTY, "claim": payload}))},  # `engine.claims` checks each
    RESULT: {"round": ROUND, "results": list_of(record({"party": PARTY, "n": SAMPLES, "upload": payload}))},
    REPORT: {"round": ROUND, "reports": list_of(payload)},
    CHECKPOINTED: {"round": ROUND},
    REFUSE: {"kind": one_of(REFUSAL_KINDS), "key": optional(setting_name)},
    BYE: {},
    ERROR: {"reason": text(MAX_TEXT)},
    HEARTBEAT: {},
    # server -> worker
    WELCOME: {
        "resume_from": optional(ROUND),
        "config": settings,
        "config_sha256": text(64),
        "session": SESSION,
        "run": optional(run_key),
    },
    TRAIN: {"round": ROUND, "tasks": list_of(record({"party": PARTY, "payload": payload}))},
    EVAL: {"round": ROUND, "payload": payload},
    CHECKPOINT: {"round": ROUND},
    FINISH: {"model": payload},  # the final global model: each site keeps it (silo/manager.py's on_finish)
    ABORT: {"reason": text(MAX_TEXT)},
    REJOIN: {},
    # a process's own timer
    TICK: {},
    **SECURE_SCHEMAS,
}


def message_problem(msg_type: Any, params: Mapping[str, Any]) -> str | None:
    """Why a message of `msg_type` with `params` (FedML's Message.get_params()) does not fit its
    declaration, or None: `field results[0].n is a float, not an integer`."""
    schema = SCHEMAS.get(msg_type) if isinstance(msg_type, str) else None
    if schema is None:
        return f"type {str(msg_type)[:40]!r} is not a message of this protocol"
    fields = {k: v for k, v in params.items() if k not in ENVELOPE}
    if problem := _keys_problem(fields, schema, frozenset()):
        return f"the message{problem}"
    for key, check in schema.items():
        if (problem := check(fields[key])) is not None:
            return f"field {key}{problem}"
    return None


def result_problem(
    items: list[dict], mine: set[int], samples: Mapping[int, int], problem: Callable[[int, Any], str | None]
) -> str | None:
    """Why a RESULT's records (of the declared types) cannot be taken, or None: one record for each
    party of `mine` (the round's tasks of the sender), each with the party's sample count `samples`
    (the server's own) and an upload that `problem(party, upload)` finds nothing wrong with (its
    shape, metric names and buffers: `engine.uploads`; NaN and Inf are checked later, where a
    diverged party is left out of the round rather than refused)."""
    if sorted(item["party"] for item in items) != sorted(mine):
        return f"results are for parties {[i['party'] for i in items][:10]}, not its parties {sorted(mine)}"
    for i, item in enumerate(items):
        party, n = item["party"], item["n"]
        if n != samples[party]:
            return (
                f"results[{i}].n {n} is not party {party}'s {samples[party]} samples (its claim, fixed "
                "for the run: a silo whose data differ is refused)"
            )
        if (why := problem(party, item["upload"])) is not None:
            return f"results[{i}].{why}"
    return None


def reports_problem(reports: list, mine: list[int], problem: Callable[[int, Any], str | None]) -> str | None:
    """Why a REPORT's reports cannot be taken, or None: one for each party of `mine` (the sender's),
    each one that `problem(party, report)` (the server's `report_problem`: `core.validate`) finds
    nothing wrong with."""
    ids = sorted(r.get("party_id") for r in reports if type(r.get("party_id")) is int)
    if ids != sorted(mine) or len(reports) != len(mine):
        return f"reports are not one for each of its parties {sorted(mine)}"
    for i, report in enumerate(reports):
        if (why := problem(report["party_id"], report)) is not None:
            return f"reports[{i}]: {why}"
    return None
