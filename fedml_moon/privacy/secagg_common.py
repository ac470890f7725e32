"""What the party and the server sides of SecAgg / SecAgg+ share: the error, the parameters, the
checks of advertised keys and of masked vectors, and the wire form of masked vectors (the graph and
the crowd rules: `secagg_graph`). Re-exported by `fedml_moon.privacy.secagg`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.privacy.secagg_crypto import KEY_BYTES, usable_public

KEY_FIELDS = ("c_pk", "s_pk", "b_commit")


class SecAggError(RuntimeError):
    """The round cannot go on: the message names the round, the parties and what to do."""


@dataclass(frozen=True)
class SecAggParams:
    """t shares of a party's neighbourhood + itself rebuild its secrets; `neighbours` = SecAgg+ degree k
    (0 or >= n - 1: every other party, plain SecAgg); masked sums live in the encoding's Z_(2^k);
    `min_group`: the fewest survivors whose sum may be unmasked (`secagg_graph.survivors_problem`)."""

    threshold: int
    neighbours: int = 0
    encoding: FixedPoint = field(default_factory=FixedPoint)
    min_group: int = 3

    def __post_init__(self) -> None:
        if not _is_int(self.threshold) or self.threshold < 1:
            raise ValueError(f"SecAggParams.threshold (t) must be an integer >= 1; got {self.threshold!r}")
        if not _is_int(self.neighbours) or self.neighbours < 0:
            raise ValueError(
                f"SecAggParams.neighbours (SecAgg+ degree k) must be an integer >= 0 (0: every other "
                f"party); got {self.neighbours!r}"
            )
        if not _is_int(self.min_group) or self.min_group < 2:
            raise ValueError(
                f"SecAggParams.min_group must be an integer >= 2 (a sum of one party is its input); "
                f"got {self.min_group!r}"
            )
        if not isinstance(self.encoding, FixedPoint):
            raise ValueError(
                f"SecAggParams.encoding must be a FixedPoint; got {type(self.encoding).__name__}"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_keys(round_idx: int, party: object, keys: object, step: str, usable: bool = True) -> None:
    """An advertise() dict: {"c_pk", "s_pk", "b_commit"} of 32 bytes each, from an integer party id;
    with `usable`, c_pk and s_pk also X25519 points that agreement can use (the server checks it once
    per round; a party's own agreement fails on such a key anyway)."""
    if not _is_int(party):
        raise SecAggError(f"round {round_idx}, {step}: party ids must be integers; got {party!r}")
    if not isinstance(keys, Mapping) or set(keys) != set(KEY_FIELDS):
        got = sorted(keys) if isinstance(keys, Mapping) else type(keys).__name__
        raise SecAggError(
            f"round {round_idx}, {step}: party {party}'s keys must be a dict with {list(KEY_FIELDS)}; "
            f"got {got}: have it send advertise()'s output unchanged"
        )
    for name in KEY_FIELDS:
        value = keys[name]
        if not isinstance(value, bytes) or len(value) != KEY_BYTES:
            size = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
            raise SecAggError(
                f"round {round_idx}, {step}: party {party}'s {name} must be {KEY_BYTES} bytes; got {size}: "
                f"leave party {party} out of the round or have it advertise again"
            )
    for name in ("c_pk", "s_pk") if usable else ():
        if not usable_public(keys[name]):
            raise SecAggError(
                f"round {round_idx}, {step}: party {party}'s {name} is a low-order X25519 point, with which "
                f"no key can be agreed: leave party {party} out of the round"
            )


def share_index(members: Sequence[int], party: int) -> int:
    """The x coordinate of `party`'s share: its 1-based position in the sorted neighbourhood + owner."""
    return sorted(members).index(party) + 1


def check_masked(round_idx: int, party: int, y: object, length: int, k: int) -> torch.Tensor:
    """A masked input: a 1-D int64 tensor of `length` values in [0, 2^k)."""
    where = f"round {round_idx}, masked input collection: party {party}'s masked vector"
    if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.dim() != 1:
        kind = f"{y.dtype} of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise SecAggError(
            f"{where} must be a 1-D int64 tensor (unpack() what came over the wire); got {kind}"
        )
    if y.numel() != length:
        raise SecAggError(f"{where} has {y.numel()} values, not {length}: drop party {party} from the round")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= 2**k):
        raise SecAggError(f"{where} has values outside [0, 2^{k}): drop party {party} from the round")
    return y


def pack(x: torch.Tensor, k: int) -> torch.Tensor:
    """What goes on the wire: int32 (the two's complement view of [0, 2^32)) when k <= 32, else int64."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int64:
        raise SecAggError(
            f"pack() takes the int64 tensor mask() returned; got {getattr(x, 'dtype', type(x))}"
        )
    if k > 32:
        return x.clone()
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def unpack(x: torch.Tensor, k: int) -> torch.Tensor:
    """Back to int64 in [0, 2^k); a wrong dtype (int32 expected for k <= 32, int64 above) or a value
    outside the range is refused."""
    want = torch.int32 if k <= 32 else torch.int64
    if not isinstance(x, torch.Tensor) or x.dtype != want:
        raise SecAggError(
            f"unpack() for k={k} takes a {want} tensor (what pack() gives); got {getattr(x, 'dtype', x)}"
        )
    out = x.to(torch.int64)
    if k <= 32:
        out = torch.remainder(out, 2**32)
    if out.numel() and (int(out.min()) < 0 or int(out.max()) >= 2**k):
        raise SecAggError(f"unpack(): values outside [0, 2^{k}): this is not a masked vector for k={k}")
    return out
