"""Secure aggregation's keys and shares as the protocol carries them (hex text and integers), for
the server's phases (`distributed/server/secure.py`) and a silo's (`distributed/silo/secure.py`)."""

from __future__ import annotations

KEY_FIELDS = ("c_pk", "s_pk", "b_commit")


def keys_to_wire(party: int, keys: dict) -> dict:
    return {"party": int(party), **{k: keys[k].hex() for k in KEY_FIELDS}}


def keys_from_wire(item: dict) -> tuple[int, dict]:
    return int(item["party"]), {k: bytes.fromhex(item[k]) for k in KEY_FIELDS}


def shares_to_wire(shares: dict[int, tuple[int, int]]) -> list[dict]:
    return [{"of": int(v), "x": int(x), "y": f"{y:032x}"} for v, (x, y) in sorted(shares.items())]


def shares_from_wire(items: list[dict]) -> dict[int, tuple[int, int]]:
    return {int(i["of"]): (int(i["x"]), int(i["y"], 16)) for i in items}
