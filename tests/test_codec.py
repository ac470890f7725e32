"""Payload bytes without pickle: round trips are exact, shared tensors are stored once, and anything
that is not an encoded tree is refused with CodecError (never executed)."""

from __future__ import annotations

import pickle
from collections import OrderedDict

import pytest
import torch

from fedml_moon.core.codec import CodecError, decode, encode
from tests.support.hostile import huge_int_frame
from tests.support.tiny import tiny_factory


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b and type(a) is type(b)


def test_payloads_and_party_state_round_trip_exactly():
    model = tiny_factory()().state_dict()
    tree = {
        "model": model,
        "party_id": 3,
        "metrics": {"loss": 0.25, "ce": float("inf")},
        "present": torch.tensor([True, False]),
        "pool": [model, model],
        "pool_rounds": [1, 2],
        "phase": "lg",
        "none": None,
        "by_party": {0: torch.zeros(2, dtype=torch.int64), 7: "x"},
        "pair": (1, "a"),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    back = decode(encode(tree))
    assert _equal(tree, back)
    assert list(back["by_party"]) == [0, 7]


def test_a_tensor_shared_by_several_parties_is_stored_once():
    state = OrderedDict(w=torch.randn(1000))
    one = len(encode({"p0": {"model": state}}))
    many = len(encode({f"p{i}": {"model": state} for i in range(10)}))
    assert many < one + 1000 < 2 * one  # ten small references, one copy of the 4000 bytes


def test_views_and_non_contiguous_tensors_are_copied():
    base = torch.arange(12.0).view(3, 4)
    back = decode(encode({"t": base.t(), "row": base[1]}))
    assert torch.equal(back["t"], base.t()) and torch.equal(back["row"], base[1])


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "shorter than"),
        (b"FMC1" + b"\xff" * 8, "claims"),
        (b"XXXX" + bytes(8), "bad magic"),
        (pickle.dumps({"model": 1}), "bad magic|shorter"),
    ],
)
def test_garbage_is_refused(data, match):
    with pytest.raises(CodecError, match=match):
        decode(data)


def test_forged_header_and_blob_are_refused():
    good = encode({"w": torch.ones(3)})
    with pytest.raises(CodecError, match="blob"):
        decode(good[:-5])
    head = b'{"v": 1, "tree": {"__tensor__": "t9"}}'
    forged = b"FMC1" + len(head).to_bytes(8, "little") + head
    with pytest.raises(CodecError, match="lacks"):
        decode(forged)
    with pytest.raises(TypeError, match="cannot encode a set"):
        encode({"s": {1, 2}})


def test_an_integer_of_too_many_digits_is_the_codecs_own_error():
    with pytest.raises(CodecError, match="does not parse"):
        decode(huge_int_frame())
