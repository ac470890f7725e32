"""Property-based fuzzing of the message decoder: whatever bytes arrive, decoding either gives a
message or raises the decoder's own CodecError; nothing else escapes and nothing is executed."""

from __future__ import annotations

import torch
from fedml.core.distributed.communication.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedml_moon.core.codec import CodecError, decode, encode
from fedml_moon.distributed.transport.base import message_bytes, message_from_bytes


def _valid() -> bytes:
    msg = Message("result", 2, 0)
    msg.add_params("round", 3)
    msg.add_params("results", [{"party": 1, "n": 64.0, "upload": {"model": {"w": torch.randn(4, 3)}}}])
    return message_bytes(msg)


VALID = _valid()
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decodes_or_refuses(data: bytes) -> None:
    try:
        message_from_bytes(data)
    except CodecError:
        pass


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(data):
    _decodes_or_refuses(data)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=16))
def test_a_valid_message_with_bytes_changed(edits):
    data = bytearray(VALID)
    for index, value in edits:
        data[index] = value
    _decodes_or_refuses(bytes(data))


@FUZZ
@given(st.integers(0, len(VALID)), st.binary(max_size=256))
def test_a_valid_message_cut_and_spliced(cut, tail):
    _decodes_or_refuses(VALID[:cut] + tail)


@FUZZ
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
        max_leaves=40,
    )
)
def test_any_json_tree_in_a_well_framed_header(tree):
    body = encode({"x": 1})
    import json

    head = json.dumps({"v": 1, "tree": tree}).encode()
    data = (
        b"FMC1" + len(head).to_bytes(8, "little") + head + body[12 + int.from_bytes(body[4:12], "little") :]
    )
    try:
        decode(data)
    except CodecError:
        pass


def test_marker_objects_of_the_wrong_kind_are_refused():
    import json

    for tree in (
        {"__tensor__": [1]},
        {"__tuple__": 5},
        {"__dict__": [[[1], 2]]},
        {"__dict__": 3},
        {"__tensor__": 7},
    ):
        head = json.dumps({"v": 1, "tree": tree}).encode()
        data = b"FMC1" + len(head).to_bytes(8, "little") + head
        try:
            decode(data)
        except CodecError:
            continue
        raise AssertionError(f"{tree} was accepted")
