"""Bytes for payloads and party state without pickle: tensors as safetensors, the rest as JSON.

A tree is any nesting of dicts, lists and tuples whose leaves are tensors, str, int, float, bool or
None (a payload `{"model": state_dict, "party_id": 3, ...}`, a party's state, a protocol message).
`encode(tree)` gives

    b"FMC1" | uint64 little-endian length of the JSON header | JSON header | safetensors blob

where the header holds the tree with every tensor replaced by `{"__tensor__": name}`. A tensor object
that appears several times (one global model sent to several parties) is stored once. `decode`
parses JSON and safetensors only, so nothing in the bytes can make it run code; anything that is not
a well-formed message raises `CodecError`.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

MAGIC = b"FMC1"
_HEADER = struct.Struct("<4sQ")
_TENSOR, _DICT, _TUPLE = "__tensor__", "__dict__", "__tuple__"
_SCALARS = (str, int, float, bool, type(None))


class CodecError(ValueError):
    """Bytes that are not a well-formed encoded tree (truncated, corrupt, forged)."""


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.names: dict[int, str] = {}

    def tree(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return {_TENSOR: self.tensor(obj)}
        if isinstance(obj, dict):
            if all(isinstance(k, str) for k in obj) and not ({_TENSOR, _DICT, _TUPLE} & set(obj)):
                return {k: self.tree(v) for k, v in obj.items()}
            return {_DICT: [[self.tree(k), self.tree(v)] for k, v in obj.items()]}
        if isinstance(obj, tuple):
            return {_TUPLE: [self.tree(v) for v in obj]}
        if isinstance(obj, list):
            return [self.tree(v) for v in obj]
        if isinstance(obj, _SCALARS):
            return obj
        raise TypeError(
            f"cannot encode a {type(obj).__name__}: payloads hold tensors, dicts, lists and JSON scalars"
        )

    def tensor(self, t: torch.Tensor) -> str:
        name = self.names.get(id(t))
        if name is None:
            name = f"t{len(self.tensors)}"
            self.names[id(t)] = name
            self.tensors[name] = t.detach().to("cpu").contiguous().clone()
        return name


def encode(tree: Any) -> bytes:
    """The bytes of `tree` (see the module docstring)."""
    enc = _Encoder()
    body = json.dumps({"v": 1, "tree": enc.tree(tree)}, allow_nan=True).encode()
    blob = st_save(enc.tensors) if enc.tensors else b""
    return _HEADER.pack(MAGIC, len(body)) + body + blob


def _rebuild(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_rebuild(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            name = obj[_TENSOR]
            if not isinstance(name, str) or name not in tensors:
                raise CodecError(f"the header names tensor {name!r}, which the blob lacks")
            return tensors[name]
        if set(obj) == {_TUPLE}:
            if not isinstance(obj[_TUPLE], list):
                raise CodecError("a tuple must be a list of items")
            return tuple(_rebuild(v, tensors) for v in obj[_TUPLE])
        if set(obj) == {_DICT}:
            pairs = obj[_DICT]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise CodecError("a keyed dict must be a list of [key, value] pairs")
            return OrderedDict((_key(_rebuild(k, tensors)), _rebuild(v, tensors)) for k, v in pairs)
        return OrderedDict((k, _rebuild(v, tensors)) for k, v in obj.items())
    return obj


def _key(key: Any) -> Any:
    if not isinstance(key, _SCALARS):
        raise CodecError(f"dict keys must be JSON scalars; got a {type(key).__name__}")
    return key


def decode(data: bytes) -> Any:
    """The tree encoded in `data`; CodecError for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise CodecError(f"{len(data)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"bad magic {magic!r}; not an encoded payload")
    if length > len(data) - _HEADER.size:
        raise CodecError(
            f"the header claims {length} bytes of JSON but only {len(data) - _HEADER.size} follow"
        )
    try:
        head = json.loads(data[_HEADER.size : _HEADER.size + length])
    except (ValueError, RecursionError) as err:  # bad UTF-8 or JSON, an integer of too many digits, ...
        raise CodecError(f"the JSON header does not parse: {str(err)[:200]}") from None
    if not isinstance(head, dict) or head.get("v") != 1 or "tree" not in head:
        raise CodecError("the JSON header is not a version-1 payload header")
    blob = data[_HEADER.size + length :]
    try:
        tensors = st_load(blob) if blob else {}
    except Exception as err:  # safetensors raises its own SafetensorError and others on garbage
        raise CodecError(f"the tensor blob does not parse: {err}") from None
    try:
        return _rebuild(head["tree"], tensors)
    except RecursionError:
        raise CodecError("the tree nests too deeply") from None
