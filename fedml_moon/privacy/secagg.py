"""Secure aggregation against an honest-but-curious server, in process: SecAgg (Bonawitz et al.,
"Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, Fig. 4) and SecAgg+
(Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020), where each
party masks with, and shares its secrets among, only its k neighbours of a sparse graph.

One round, U1 >= U2 >= U3 >= U4 the parties still there at each step:
  0. AdvertiseKeys: every party sends (c_pk, s_pk, b_commit) (`PartySession.advertise`); the server
     hands each its neighbourhood's keys (`ServerSession.collect_keys`).
  1. ShareKeys: each party Shamir-shares its self-mask seed b_u and its s-seed among its neighbourhood
     + itself and sends each neighbour its shares under AES-GCM (`share`); the server routes them
     (`route`).
  2. MaskedInputCollection: y_u = encode(x_u) + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)
     mod 2^k (`mask`); the server takes them (`collect_masked`).
  3. Unmasking: each survivor reveals its shares of b_v for survivors v and of the s-seed of dropped v,
     never both for one v (`PartySession.unmask`); the server rebuilds those secrets, checks them
     against what was advertised and removes the masks (`ServerSession.unmask`, `decode`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence

import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedml_moon.core import shamir
from fedml_moon.privacy import secagg_crypto as crypto
from fedml_moon.privacy.secagg_common import (
    SecAggError,
    SecAggParams,
    check_keys,
    neighbourhood,
    pack,
    unpack,
)
from fedml_moon.privacy.secagg_server import ServerSession

__all__ = [
    "PartySession",
    "SecAggError",
    "SecAggParams",
    "ServerSession",
    "neighbourhood",
    "pack",
    "unpack",
]

log = logging.getLogger(__name__)


class PartySession:
    """One party u in one round, with fresh keys (Bonawitz et al. 2017, Fig. 4, user side)."""

    def __init__(self, party: int, round_idx: int, params: SecAggParams) -> None:
        self.party, self.round_idx, self.params = party, round_idx, params
        self._c_key = X25519PrivateKey.generate()
        self._s_seed = secrets.randbits(126)
        self._s_key = crypto.s_key_from_seed(self._s_seed)
        self._b = secrets.randbits(126)
        self._keys = {
            "c_pk": crypto.public_bytes(self._c_key),
            "s_pk": crypto.public_bytes(self._s_key),
            "b_commit": crypto.commit(self._b),
        }
        self._roster: dict[int, dict] = {}
        self._neighbours: list[int] = []
        self._held: dict[int, tuple[int, int, int]] = {}  # v -> (x, y of b_v, y of v's s-seed)
        self._masked = False
        self._revealed = False

    def _fail(self, step: str, what: str) -> SecAggError:
        return SecAggError(f"round {self.round_idx}, {step}: party {self.party}: {what}")

    def advertise(self) -> dict:
        """Round 0 (AdvertiseKeys): {"c_pk", "s_pk", "b_commit"}, 32 bytes each."""
        return dict(self._keys)

    def share(self, roster: Mapping[int, dict]) -> dict[int, bytes]:
        """Round 1 (ShareKeys; Bonawitz et al. 2017, Fig. 4; Bell et al. 2020: neighbours only): one
        AES-GCM ciphertext per neighbour v holding v's shares of b_u and of u's s-seed. `roster`: the
        advertised keys of the round's participants, its own included (all of them, or the
        neighbourhood the server handed out: the graph is the same)."""
        step = "share keys"
        if self._roster:
            raise self._fail(step, "share() was already called this round")
        for v, keys in roster.items():
            check_keys(self.round_idx, v, keys, step)
        if roster.get(self.party) != self._keys:
            raise self._fail(step, "the roster's entry for this party is not the keys it advertised")
        neighbours = neighbourhood(list(roster), self.party, self.params.neighbours)
        members = sorted([*neighbours, self.party])
        t = self.params.threshold
        if len(members) < t:
            raise self._fail(
                step,
                f"only {len(members)} parties in its neighbourhood + itself ({members}), fewer than the "
                f"threshold t={t}: lower t or have more parties (or neighbours) in the round",
            )
        b_shares = shamir.split(self._b, t, len(members))
        s_shares = shamir.split(self._s_seed, t, len(members))
        out: dict[int, bytes] = {}
        for (x, y_b), (_, y_s), v in zip(b_shares, s_shares, members, strict=True):
            if v == self.party:
                self._held[v] = (x, y_b, y_s)
                continue
            key = self._agree(step, v, roster[v]["c_pk"])
            out[v] = crypto.seal_shares(key, self.round_idx, self.party, v, (x, y_b, y_s))
        self._roster = {v: dict(roster[v]) for v in members}
        self._neighbours = neighbours
        return out

    def _agree(self, step: str, v: int, c_pk: bytes) -> bytes:
        try:
            return crypto.share_key(self._c_key, c_pk, self.round_idx, self.party, v)
        except ValueError as exc:
            raise self._fail(step, f"party {v}'s c_pk is not a usable X25519 key ({exc})") from exc

    def _pair_seed(self, step: str, v: int) -> bytes:
        try:
            return crypto.pair_seed(self._s_key, self._roster[v]["s_pk"], self.round_idx, self.party, v)
        except ValueError as exc:
            raise self._fail(step, f"party {v}'s s_pk is not a usable X25519 key ({exc})") from exc

    def mask(self, vector: torch.Tensor, inbox: Mapping[int, bytes]) -> torch.Tensor:
        """Round 2 (MaskedInputCollection; Bonawitz et al. 2017, Fig. 4): decrypts and checks the shares
        in `inbox` (sender -> ciphertext), then returns y_u = encode(x_u) + PRG(b_u) + sum_{v > u}
        PRG(s_uv) - sum_{v < u} PRG(s_uv) mod 2^k over the senders v, as int64 in [0, 2^k)."""
        step = "masked input collection"
        if not self._roster or self._masked:
            raise self._fail(step, "mask() comes once, after share()")
        if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or not vector.is_floating_point():
            raise self._fail(step, "the input must be a 1-D float tensor")
        self._open_inbox(step, inbox)
        k = self.params.encoding.k
        acc = self.params.encoding.encode(vector.detach().cpu()).numpy().astype(crypto.word_dtype(k))
        acc += crypto.prg(crypto.self_seed(self._b, self.round_idx), acc.size, k)
        for v in sorted(inbox):
            seed = self._pair_seed(step, v)
            if v > self.party:
                acc += crypto.prg(seed, acc.size, k)
            else:
                acc -= crypto.prg(seed, acc.size, k)
        self._masked = True
        return torch.from_numpy(crypto.reduce(acc, k))

    def _open_inbox(self, step: str, inbox: Mapping[int, bytes]) -> None:
        """Decrypts every sender's ciphertext; a stranger, a tampered, replayed or relabelled one is
        refused naming the sender; fewer than t - 1 senders leave b_u unrecoverable and are refused."""
        t = self.params.threshold
        if len(inbox) + 1 < t:
            raise self._fail(
                step,
                f"only {len(inbox)} neighbours shared with it ({sorted(inbox)}); with itself fewer than the "
                f"threshold t={t}: this party cannot take part, treat it as dropped",
            )
        held: dict[int, tuple[int, int, int]] = {}
        for v, blob in inbox.items():
            if v not in self._neighbours:
                raise self._fail(
                    step, f"got shares from party {v}, not one of its neighbours {self._neighbours}"
                )
            key = self._agree(step, v, self._roster[v]["c_pk"])
            try:
                if not isinstance(blob, bytes):
                    raise ValueError(f"a {type(blob).__name__}, not bytes")
                held[v] = crypto.open_shares(key, self.round_idx, v, self.party, blob)
            except (InvalidTag, ValueError) as exc:
                raise self._fail(
                    step,
                    f"the shares from party {v} do not decrypt ({type(exc).__name__}: tampered, replayed "
                    f"from another round or relabelled from another sender): drop party {v}, rerun the round",
                ) from exc
        self._held.update(held)

    def unmask(self, survivors: Sequence[int], dropped: Sequence[int]) -> dict:
        """Round 3 (Unmasking; Bonawitz et al. 2017, Fig. 4, round 4): this party's shares of b_v for the
        surviving v and of the s-seed of the dropped v, {"b": {v: (x, y)}, "s": {v: (x, y)}}, each v one
        that shared with it. Refuses, revealing nothing, when the lists overlap, name a party that did
        not share with it, leave fewer than t of its neighbourhood + itself, or come a second time."""
        step = "unmasking"
        if not self._masked:
            raise self._fail(step, "unmask() comes after mask()")
        if self._revealed:
            raise self._fail(step, "unmask() was already answered this round: shares are revealed once")
        alive, gone = set(survivors), set(dropped)
        if alive & gone:
            raise self._fail(
                step, f"parties {sorted(alive & gone)} are both survivors and dropped: refusing to reveal"
            )
        strangers = (alive | gone) - set(self._held)
        if strangers:
            raise self._fail(
                step, f"parties {sorted(strangers)} did not share with this party: refusing to reveal"
            )
        if self.party in gone:
            raise self._fail(step, "it is answering, so it cannot be listed as dropped: refusing to reveal")
        here = len(alive & {self.party, *self._neighbours})
        if here < self.params.threshold:
            raise self._fail(
                step,
                f"only {here} of its neighbourhood + itself survive, fewer than the threshold "
                f"t={self.params.threshold}: refusing to reveal; the round cannot be completed",
            )
        self._revealed = True
        log.debug(
            "round %d: party %d reveals %d + %d shares", self.round_idx, self.party, len(alive), len(gone)
        )
        return {
            "b": {v: (self._held[v][0], self._held[v][1]) for v in sorted(alive)},
            "s": {v: (self._held[v][0], self._held[v][2]) for v in sorted(gone)},
        }
