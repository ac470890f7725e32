"""Secure aggregation against an honest-but-curious server, in process: SecAgg (Bonawitz et al.,
"Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, Fig. 4) and SecAgg+
(Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020), where each
party masks with, and shares its secrets among, only its k neighbours of a sparse graph.

One round, U1 >= U2 >= U3 >= U4 the parties still there at each step:
  0. AdvertiseKeys: every party sends (c_pk, s_pk, b_commit) (`PartySession.advertise`); the server
     draws the round's graph from their digests and hands each its neighbourhood's keys and every
     participant's key digest (`ServerSession.collect_keys`); each party recomputes the graph and
     checks its neighbourhood (`secagg_graph`).
  1. ShareKeys: each party Shamir-shares its self-mask seed b_u and its s-seed among its neighbourhood
     + itself and sends each neighbour its shares under AES-GCM (`share`); the server routes them
     (`route`).
  2. MaskedInputCollection: y_u = encode(x_u) + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)
     mod 2^k over the senders v whose shares opened (`mask`; the others are named in `accused`); the
     server takes them and drops every accused party (`collect_masked`).
  3. Unmasking: the server and each survivor check the crowd rules on the whole round's lists; each
     survivor reveals its shares of b_v for survivors v and of the s-seed of dropped v, never both
     for one v (`PartySession.unmask`); the server rebuilds those secrets, checks them against what
     was advertised, steps around wrong shares and removes the masks (`ServerSession.unmask`).
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
    pack,
    share_index,
    unpack,
)
from fedml_moon.privacy.secagg_graph import (
    RoundGraph,
    key_digest,
    neighbourhood_size,
    own_seed_problem,
    reveal_problem,
    round_problem,
)
from fedml_moon.privacy.secagg_server import ServerSession

__all__ = [
    "PartySession",
    "RoundGraph",
    "SecAggError",
    "SecAggParams",
    "ServerSession",
    "key_digest",
    "neighbourhood_size",
    "pack",
    "unpack",
]

log = logging.getLogger(__name__)


class PartySession:
    """One party u in one round, with fresh keys (Bonawitz et al. 2017, Fig. 4, user side).
    `accused`: after mask(), the neighbours whose shares did not open (sent in its masked message)."""

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
        self._graph: RoundGraph | None = None
        self._roster: dict[int, dict] = {}
        self._held: dict[int, tuple[int, int, int]] = {}  # v -> (x, y of b_v, y of v's s-seed)
        self.accused: list[int] = []
        self._masked = False
        self._revealed = False

    def _fail(self, step: str, what: str) -> SecAggError:
        return SecAggError(f"round {self.round_idx}, {step}: party {self.party}: {what}")

    @property
    def graph(self) -> RoundGraph | None:
        """The round's graph as this party drew it in share() (None before)."""
        return self._graph

    def advertise(self) -> dict:
        """Round 0 (AdvertiseKeys): {"c_pk", "s_pk", "b_commit"}, 32 bytes each."""
        return dict(self._keys)

    def share(self, roster: Mapping[int, dict], digests: Mapping[int, bytes]) -> dict[int, bytes]:
        """Round 1 (ShareKeys; Bonawitz et al. 2017, Fig. 4; Bell et al. 2020: neighbours only): one
        AES-GCM ciphertext per neighbour v holding v's shares of b_u and of u's s-seed. `roster`: the
        advertised keys of its neighbourhood, its own included; `digests`: every participant's key
        digest, from which it draws the round's graph itself and checks the roster against it."""
        step = "share keys"
        if self._graph is not None:
            raise self._fail(step, "share() was already called this round")
        for v, keys in roster.items():
            check_keys(self.round_idx, v, keys, step, usable=False)
        if roster.get(self.party) != self._keys:
            raise self._fail(step, "the roster's entry for this party is not the keys it advertised")
        graph = self._check_graph(step, roster, digests)
        members = graph.members(self.party)
        t = self.params.threshold
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
        self._graph = graph
        return out

    def _check_graph(self, step: str, roster: Mapping[int, dict], digests: Mapping[int, bytes]) -> RoundGraph:
        """The round's graph drawn from `digests` (Bell et al. 2020, Sec. 4), once its own digest is
        its keys', every roster entry its digest's, the round meets the crowd rules and the roster is
        exactly its neighbourhood in that graph."""
        if not isinstance(digests, Mapping) or digests.get(self.party) != key_digest(self._keys):
            raise self._fail(
                step, "the participants' digests do not hold the digest of the keys it advertised"
            )
        for v, keys in roster.items():
            if digests.get(v) != key_digest(keys):
                raise self._fail(
                    step, f"party {v}'s keys in the roster do not match its digest: refusing to share"
                )
        graph = RoundGraph.draw(self.round_idx, digests, self.params.neighbours)
        problem = round_problem(len(digests), graph.size(), self.params)
        if problem is not None:
            raise self._fail(step, f"{problem}: refusing to share")
        expected = graph.members(self.party)
        if sorted(roster) != expected:
            raise self._fail(
                step,
                f"the roster hands it the neighbourhood {sorted(roster)[:10]}, but the round's graph (drawn "
                f"from every participant's keys) gives {expected[:10]}: refusing to share",
            )
        return graph

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
        in `inbox` (sender -> ciphertext); a sender whose shares do not open is left out and named in
        `accused`. Returns y_u = encode(x_u) + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)
        mod 2^k over the other senders v, as int64 in [0, 2^k)."""
        step = "masked input collection"
        if self._graph is None or self._masked:
            raise self._fail(step, "mask() comes once, after share()")
        if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or not vector.is_floating_point():
            raise self._fail(step, "the input must be a 1-D float tensor")
        senders = self._open_inbox(step, inbox)
        k = self.params.encoding.k
        acc = self.params.encoding.encode(vector.detach().cpu()).numpy().astype(crypto.word_dtype(k))
        acc += crypto.prg(crypto.self_seed(self._b, self.round_idx), acc.size, k)
        for v in senders:
            seed = self._pair_seed(step, v)
            if v > self.party:
                acc += crypto.prg(seed, acc.size, k)
            else:
                acc -= crypto.prg(seed, acc.size, k)
        self._masked = True
        return torch.from_numpy(crypto.reduce(acc, k))

    def _open_inbox(self, step: str, inbox: Mapping[int, bytes]) -> list[int]:
        """The senders whose shares open, sorted; a stranger is refused; one whose ciphertext is
        tampered, replayed, relabelled or holds shares of the wrong form is left out and named in
        `accused`; fewer than t - 1 good senders leave b_u unrecoverable and are refused."""
        neighbours = self._graph.neighbours[self.party]
        strangers = sorted(set(inbox) - neighbours)
        if strangers:
            raise self._fail(
                step, f"got shares from parties {strangers}, not among its neighbours {sorted(neighbours)}"
            )
        held, bad = {}, []
        for v, blob in sorted(inbox.items()):
            share = self._open(v, blob)
            if share is None:
                bad.append(v)
            else:
                held[v] = share
        if bad:
            log.warning(
                "round %d: party %d: the shares from parties %s do not open (tampered, replayed, relabelled "
                "or malformed): it does not mask with them and names them to the server",
                self.round_idx,
                self.party,
                bad,
            )
        t = self.params.threshold
        if len(held) + 1 < t:
            raise self._fail(
                step,
                f"only {len(held)} neighbours' shares opened ({sorted(held)}); with itself fewer than the "
                f"threshold t={t}: this party cannot take part, treat it as dropped",
            )
        self._held.update(held)
        self.accused = bad
        return sorted(held)

    def _open(self, v: int, blob: object) -> tuple[int, int, int] | None:
        """v's shares for this party, or None where they do not decrypt or are not a share of v's."""
        try:
            key = crypto.share_key(self._c_key, self._roster[v]["c_pk"], self.round_idx, self.party, v)
            if not isinstance(blob, bytes):
                return None
            x, y_b, y_s = crypto.open_shares(key, self.round_idx, v, self.party, blob)
        except (InvalidTag, ValueError):
            return None
        if x != share_index(self._graph.members(v), self.party) or max(y_b, y_s) >= shamir.P:
            return None
        return x, y_b, y_s

    def unmask(self, survivors: Sequence[int], dropped: Sequence[int]) -> dict:
        """Round 3 (Unmasking; Bonawitz et al. 2017, Fig. 4, round 4): given the whole round's
        survivors and dropped, this party's shares of b_v for the surviving v and of the s-seed of the
        dropped v among the senders it holds, {"b": {v: (x, y)}, "s": {v: (x, y)}}. Refuses, revealing
        nothing, what `reveal_problem` names (the crowd rules recomputed on its own graph and threshold,
        lists that overlap or leave out a sender, fewer than t survivors around it) and a second call."""
        step = "unmasking"
        if not self._masked:
            raise self._fail(step, "unmask() comes after mask()")
        if self._revealed:
            raise self._fail(step, "unmask() was already answered this round: shares are revealed once")
        if self.party in dropped:
            return self._own_seed_share(step, survivors, dropped)
        held = set(self._held)
        problem = reveal_problem(self._graph, self.party, held, survivors, dropped, self.params)
        if problem is not None:
            raise self._fail(step, problem)
        self._revealed = True
        alive, gone = sorted(set(survivors) & held), sorted(set(dropped) & held)
        log.debug(
            "round %d: party %d reveals %d + %d shares", self.round_idx, self.party, len(alive), len(gone)
        )
        return {
            "b": {v: (self._held[v][0], self._held[v][1]) for v in alive},
            "s": {v: (self._held[v][0], self._held[v][2]) for v in gone},
        }

    def _own_seed_share(self, step: str, survivors: Sequence[int], dropped: Sequence[int]) -> dict:
        """A party the round dropped after its masked input (a neighbour named it for bad shares): its
        own share of its s-seed, which the server rebuilds anyway to remove its pairwise masks, so
        that the accuser's missing share does not leave the seed short of t; never a b share (its
        input, left out of the sum, stays masked by b_u)."""
        problem = own_seed_problem(self._graph, self.party, survivors, dropped, self.params)
        if problem is not None:
            raise self._fail(step, problem)
        self._revealed = True
        x, _, y_s = self._held[self.party]
        return {"b": {}, "s": {self.party: (x, y_s)}}
