"""A model's fingerprint: SHA-256 over a state dict, independent of how it was saved.

Two runs that end with the same parameters have the same digest, whatever file format, device or
memory layout held them, so a digest in summary.json tells at a glance whether two runs (a resumed
one and one never interrupted, two transports, two machines) ended with the same model.

The hash covers, for each entry in sorted key order: the key (UTF-8), the dtype's name, the shape,
and the raw bytes of the tensor (on the CPU, contiguous, in the machine's byte order: little-endian
on every platform PyTorch ships for), each field length-prefixed so no two different state dicts
produce the same byte stream.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

import torch


def _field(h: hashlib._Hash, data: bytes) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def state_dict_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 of `state` (name -> tensor): keys, dtypes, shapes and values all count."""
    h = hashlib.sha256()
    _field(h, b"fedml_moon state dict v1")
    for key in sorted(state):
        tensor = state[key]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        _field(h, str(key).encode())
        _field(h, str(flat.dtype).removeprefix("torch.").encode())
        _field(h, ",".join(str(n) for n in tensor.shape).encode())
        _field(h, flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()
