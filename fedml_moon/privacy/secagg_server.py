"""The server side of one SecAgg / SecAgg+ round (Bonawitz et al., CCS 2017, Fig. 4, server side;
Bell et al., CCS 2020: the neighbourhoods of a sparse graph). Honest but curious: it follows the
protocol, and learns only the sum of the survivors' inputs. Re-exported by `fedml_moon.privacy.secagg`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
import torch

from fedml_moon.core import shamir
from fedml_moon.privacy import secagg_crypto as crypto
from fedml_moon.privacy.secagg_common import (
    SecAggError,
    SecAggParams,
    check_keys,
    check_masked,
    neighbourhood,
    share_index,
)

log = logging.getLogger(__name__)
Points = dict[int, tuple[int, int]]  # responder -> its (x, y) share of one secret


class ServerSession:
    """The server of one round: routes keys and shares, sums masked inputs, rebuilds the secrets of
    the survivors (b_u) and of the dropped (s-seeds) and removes the masks."""

    def __init__(self, round_idx: int, params: SecAggParams, length: int) -> None:
        self.round_idx, self.params, self.length = round_idx, params, length
        self.survivors: list[int] = []
        self.dropped: list[int] = []
        self._keys: dict[int, dict] = {}
        self._members: dict[int, list[int]] = {}  # u -> sorted neighbourhood + u (u's share holders)
        self._inbox: dict[int, set[int]] = {}  # receiver -> the senders whose shares it got
        self._sum: np.ndarray | None = None
        self._done = False

    def _fail(self, step: str, what: str) -> SecAggError:
        return SecAggError(f"round {self.round_idx}, {step}: {what}")

    def collect_keys(self, keys: Mapping[int, dict]) -> dict[int, dict[int, dict]]:
        """Round 0 (AdvertiseKeys): checks every advertise() dict (U1) and returns, per party, the roster
        it must receive: the keys of its neighbourhood and its own."""
        step, t = "advertise keys", self.params.threshold
        for u, entry in keys.items():
            check_keys(self.round_idx, u, entry, step)
        if len(keys) < t:
            raise self._fail(
                step,
                f"only {len(keys)} parties advertised keys, fewer than the threshold t={t}: wait for more",
            )
        self._keys = {u: dict(entry) for u, entry in keys.items()}
        ids = sorted(keys)
        self._members = {u: sorted([*neighbourhood(ids, u, self.params.neighbours), u]) for u in ids}
        small = min(len(m) for m in self._members.values())
        if small < t:
            raise self._fail(
                step,
                f"neighbourhoods of {small} parties (itself included) cannot reach the threshold t={t}: "
                f"lower t or raise neighbours (now {self.params.neighbours})",
            )
        return {u: {v: dict(self._keys[v]) for v in self._members[u]} for u in ids}

    def route(self, shares: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """Round 1 (ShareKeys): sender-major -> receiver-major. The senders are U2; a party that sent no
        shares drops out here, and its neighbours get nothing from it."""
        step, t = "share keys", self.params.threshold
        if not self._members:
            raise self._fail(step, "route() comes after collect_keys()")
        for u, out in shares.items():
            if u not in self._members:
                raise self._fail(step, f"party {u} sent shares but did not advertise keys: ignore it")
            expected = set(self._members[u]) - {u}
            if set(out) != expected:
                raise self._fail(
                    step,
                    f"party {u} addressed shares to {sorted(out)}, but its neighbours are "
                    f"{sorted(expected)}: a party shares with exactly its neighbours; drop party {u}",
                )
        senders = sorted(shares)
        if len(senders) < t:
            raise self._fail(step, f"only {len(senders)} parties shared keys, fewer than the threshold t={t}")
        gone = sorted(set(self._members) - set(senders))
        if gone:
            log.info("round %d: parties %s dropped before sharing keys", self.round_idx, gone)
        routed = {v: {u: shares[u][v] for u in senders if v in shares[u]} for v in senders}
        self._inbox = {v: set(inbox) for v, inbox in routed.items()}
        return routed

    def collect_masked(self, masked: Mapping[int, torch.Tensor]) -> tuple[list[int], list[int]]:
        """Round 2 (MaskedInputCollection): the masked inputs of U3, checked and summed. Returns
        (survivors, dropped): dropped = shared keys (U2) but sent no masked input."""
        step, t, k = "masked input collection", self.params.threshold, self.params.encoding.k
        if not self._inbox or self._sum is not None:
            raise self._fail(step, "collect_masked() comes once, after route()")
        for u in masked:
            if u not in self._inbox:
                raise self._fail(
                    step, f"party {u} sent a masked input but no shares were routed to it: ignore it"
                )
        if len(masked) < t:
            raise self._fail(step, f"only {len(masked)} masked inputs came, fewer than the threshold t={t}")
        total = np.zeros(self.length, dtype=crypto.word_dtype(k))
        for u in sorted(masked):
            total += check_masked(self.round_idx, u, masked[u], self.length, k).numpy().astype(total.dtype)
        self._sum = total
        self.survivors = sorted(masked)
        self.dropped = sorted(set(self._inbox) - set(masked))
        if self.dropped:
            log.info("round %d: parties %s dropped after sharing keys", self.round_idx, self.dropped)
        return list(self.survivors), list(self.dropped)

    def unmask_requests(self) -> dict[int, tuple[list[int], list[int]]]:
        """What each survivor u is asked in round 3: (the survivors, the dropped) among the parties that
        shared with u, u itself counted as a survivor; the arguments of its `PartySession.unmask`."""
        out = {}
        for u in self.survivors:
            sharers = self._inbox[u]
            out[u] = (sorted((sharers | {u}) & set(self.survivors)), sorted(sharers & set(self.dropped)))
        return out

    def unmask(self, responses: Mapping[int, dict]) -> torch.Tensor:
        """Round 3 (Unmasking; Bonawitz et al. 2017, Fig. 4, round 4): rebuilds b_u of every survivor and
        the s-seed of every dropped party from >= t shares each, checks them against b_commit and s_pk,
        and removes the masks. Returns the int64 sum in [0, 2^k) of the survivors' encoded inputs."""
        step, k = "unmasking", self.params.encoding.k
        if self._sum is None or self._done:
            raise self._fail(step, "unmask() comes once, after collect_masked()")
        b_points, s_points = self._gather(step, responses)
        b_seeds = {u: self._rebuild("b-seed", u, b_points[u], self._b_check(u)) for u in self.survivors}
        s_seeds = {v: self._rebuild("s-seed", v, s_points[v], self._s_check(v)) for v in self.dropped}
        total = self._sum.copy()
        for u in self.survivors:
            total -= crypto.prg(crypto.self_seed(b_seeds[u], self.round_idx), self.length, k)
        for v, seed in s_seeds.items():
            s_key = crypto.s_key_from_seed(seed)
            for u in self.survivors:
                if v not in self._inbox[u]:
                    continue
                pair = crypto.pair_seed(s_key, self._keys[u]["s_pk"], self.round_idx, v, u)
                if v > u:  # u added PRG(s_uv)
                    total -= crypto.prg(pair, self.length, k)
                else:
                    total += crypto.prg(pair, self.length, k)
        self._done = True
        return torch.from_numpy(crypto.reduce(total, k))

    def decode(self, total: torch.Tensor) -> torch.Tensor:
        """The float64 sum of the survivors' (clipped) inputs: encoding.decode(total, len(survivors))."""
        if not self.survivors:
            raise self._fail("decoding", "decode() comes after collect_masked() and unmask()")
        return self.params.encoding.decode(total, len(self.survivors))

    def _gather(
        self, step: str, responses: Mapping[int, dict]
    ) -> tuple[dict[int, Points], dict[int, Points]]:
        """The responses' shares, secret by secret, each checked for shape and for its x coordinate."""
        b_points: dict[int, Points] = {u: {} for u in self.survivors}
        s_points: dict[int, Points] = {v: {} for v in self.dropped}
        for w, answer in responses.items():
            if w not in self.survivors:
                raise self._fail(step, f"party {w} answered but is not a survivor: ignore its answer")
            if not isinstance(answer, Mapping) or set(answer) != {"b", "s"}:
                raise self._fail(step, f"party {w}'s answer must be unmask()'s {{'b': ..., 's': ...}} dict")
            for kind, wanted in (("b", b_points), ("s", s_points)):
                for owner, share in answer[kind].items():
                    if owner in wanted:
                        wanted[owner][w] = self._check_share(step, w, owner, share)
        return b_points, s_points

    def _check_share(self, step: str, w: int, owner: int, share: object) -> tuple[int, int]:
        ok = isinstance(share, tuple | list) and len(share) == 2 and all(isinstance(c, int) for c in share)
        if not ok or not 0 <= share[1] < shamir.P:
            raise self._fail(step, f"party {w}'s share for party {owner} is not an (x, y) pair in the field")
        if owner not in self._inbox.get(w, set()) and owner != w:
            raise self._fail(
                step, f"party {w} returned a share for party {owner}, which never shared with it"
            )
        if share[0] != share_index(self._members[owner], w):
            raise self._fail(
                step, f"party {w}'s share for party {owner} has the wrong x = {share[0]}: drop it"
            )
        return share[0], share[1]

    def _b_check(self, u: int) -> Callable[[int], bool]:
        return lambda secret: crypto.commit(secret) == self._keys[u]["b_commit"]

    def _s_check(self, v: int) -> Callable[[int], bool]:
        return lambda seed: crypto.public_bytes(crypto.s_key_from_seed(seed)) == self._keys[v]["s_pk"]

    def _rebuild(self, what: str, owner: int, points: Points, check: Callable[[int], bool]) -> int:
        """One secret from its shares (Shamir, any t), refused when fewer than t came back or when it
        does not match what `owner` advertised; then the share off the true polynomial is named."""
        t, step = self.params.threshold, "unmasking"
        givers = sorted(points)
        if len(givers) < t:
            raise self._fail(
                step,
                f"only {len(givers)} shares of party {owner}'s {what} came back (from parties {givers}), "
                f"fewer than the threshold t={t}: the sum cannot be recovered; rerun the round with the "
                "parties still online",
            )
        secret = shamir.combine([points[w] for w in givers], t)
        if check(secret):
            return secret
        bad = _off_polynomial(points, t, check)
        blame = (
            f"the share from parties {bad} is tampered"
            if bad
            else f"one of the shares from {givers} is wrong"
        )
        raise self._fail(
            step,
            f"party {owner}'s {what} rebuilt from the shares of parties {givers} does not match what it "
            f"advertised ({'b_commit' if what == 'b-seed' else 's_pk'}): {blame}; no sum this round",
        )


def _off_polynomial(points: Points, t: int, check: Callable[[int], bool]) -> list[int]:
    """The responders whose shares are off the polynomial that t of the others agree on (and that gives
    the advertised secret), when leaving one responder out finds such t; else []."""
    givers = sorted(points)
    for left_out in givers:
        rest = [points[w] for w in givers if w != left_out][:t]
        if len(rest) == t and check(shamir.interpolate(rest)):
            return [w for w in givers if shamir.interpolate(rest, at=points[w][0]) != points[w][1]]
    return []
