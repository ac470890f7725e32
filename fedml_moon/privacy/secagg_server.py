"""The server side of one SecAgg / SecAgg+ round (Bonawitz et al., CCS 2017, Fig. 4, server side;
Bell et al., CCS 2020: the neighbourhoods of a random sparse graph). Honest but curious: it follows
the protocol, and learns only the sum of the survivors' inputs, and only when the survivors are a
connected crowd of the round's graph (`secagg_graph`). Re-exported by `fedml_moon.privacy.secagg`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
import torch

from fedml_moon.privacy import secagg_crypto as crypto
from fedml_moon.privacy.secagg_common import SecAggError, SecAggParams, check_keys, check_masked
from fedml_moon.privacy.secagg_graph import RoundGraph, key_digest, round_problem, survivors_problem
from fedml_moon.privacy.secagg_rebuild import Rebuilder

log = logging.getLogger(__name__)


class ServerSession:
    """The server of one round: draws the graph, routes keys and shares, sums the masked inputs of
    the survivors, rebuilds their self-mask seeds (b_u) and the dropped parties' s-seeds, and removes
    the masks. A party named by a neighbour for shares that do not decrypt is dropped from the round."""

    def __init__(self, round_idx: int, params: SecAggParams, length: int) -> None:
        self.round_idx, self.params, self.length = round_idx, params, length
        self.survivors: list[int] = []
        self.dropped: list[int] = []
        self.named: list[int] = []
        self.digests: dict[int, bytes] = {}
        self.graph: RoundGraph | None = None
        self.accused: dict[int, list[int]] = {}  # a party named for bad shares -> who named it
        self.blamed: dict[int, list[str]] = {}  # a party -> what its unmasking shares got wrong
        self._keys: dict[int, dict] = {}
        self._inbox: dict[int, set[int]] = {}  # receiver -> the senders it masked with
        self._sum: np.ndarray | None = None
        self._done = False

    def _fail(self, step: str, what: str) -> SecAggError:
        return SecAggError(f"round {self.round_idx}, {step}: {what}")

    def collect_keys(self, keys: Mapping[int, dict]) -> tuple[dict[int, dict[int, dict]], dict[int, bytes]]:
        """Round 0 (AdvertiseKeys): checks every advertise() dict (U1), draws the round's graph from
        their digests (`RoundGraph.draw`) and refuses a round below the crowd rules (`round_problem`).
        Returns (per party, the roster it must receive: its neighbourhood's keys and its own; every
        participant's key digest, sent to all so that each recomputes the graph)."""
        step = "advertise keys"
        for u, entry in keys.items():
            check_keys(self.round_idx, u, entry, step)
        self._keys = {u: dict(entry) for u, entry in keys.items()}
        self.digests = {u: key_digest(entry) for u, entry in self._keys.items()}
        self.graph = RoundGraph.draw(self.round_idx, self.digests, self.params.neighbours)
        problem = round_problem(len(keys), self.graph.size(), self.params)
        if problem is not None:
            raise self._fail(step, problem)
        rosters = {u: {v: dict(self._keys[v]) for v in self.graph.members(u)} for u in sorted(keys)}
        return rosters, dict(self.digests)

    def route(self, shares: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """Round 1 (ShareKeys): sender-major -> receiver-major. The senders are U2; a party that sent no
        shares drops out here, and its neighbours get nothing from it."""
        step = "share keys"
        if self.graph is None:
            raise self._fail(step, "route() comes after collect_keys()")
        for u, out in shares.items():
            if u not in self.graph.neighbours:
                raise self._fail(step, f"party {u} sent shares but did not advertise keys: ignore it")
            expected = set(self.graph.neighbours[u])
            if set(out) != expected:
                raise self._fail(
                    step,
                    f"party {u} addressed shares to {sorted(out)}, but its neighbours are "
                    f"{sorted(expected)}: a party shares with exactly its neighbours; drop party {u}",
                )
        senders = sorted(shares)
        t, group = self.params.threshold, self.params.min_group
        if len(senders) < max(t, group):
            raise self._fail(
                step,
                f"only {len(senders)} parties shared keys, fewer than the threshold t={t} or "
                f"secagg_min_group={group}: no sum can be revealed this round",
            )
        gone = sorted(set(self.graph.neighbours) - set(senders))
        if gone:
            log.info("round %d: parties %s dropped before sharing keys", self.round_idx, gone)
        routed = {v: {u: shares[u][v] for u in senders if v in shares[u]} for v in senders}
        self._inbox = {v: set(inbox) for v, inbox in routed.items()}
        return routed

    def collect_masked(
        self, masked: Mapping[int, torch.Tensor], accused: Mapping[int, Iterable[int]] | None = None
    ) -> tuple[list[int], list[int]]:
        """Round 2 (MaskedInputCollection): the masked inputs of U3, checked and summed, less the
        parties a neighbour named in `accused` (accuser -> senders whose shares did not decrypt): those
        are dropped, their inputs left out even if they came. Refuses, before any share is revealed,
        a round whose survivors break the crowd rules (`survivors_problem`). Returns (survivors,
        dropped): dropped = shared keys (U2) but not in the sum."""
        step, k = "masked input collection", self.params.encoding.k
        if not self._inbox or self._sum is not None:
            raise self._fail(step, "collect_masked() comes once, after route()")
        for u in masked:
            if u not in self._inbox:
                raise self._fail(
                    step, f"party {u} sent a masked input but no shares were routed to it: ignore it"
                )
        named = self._take_accusations(step, accused or {}, masked)
        survivors = sorted(set(masked) - named)
        problem = survivors_problem(self.graph, survivors, self.params.min_group)
        if problem is not None:
            raise self._fail(step, problem)
        total = np.zeros(self.length, dtype=crypto.word_dtype(k))
        for u in survivors:
            total += check_masked(self.round_idx, u, masked[u], self.length, k).numpy().astype(total.dtype)
        self._sum = total
        self.survivors = survivors
        self.dropped = sorted(set(self._inbox) - set(survivors))
        self.named = sorted(named & set(masked))  # dropped after their masked input: asked their own seed
        if self.dropped:
            log.info("round %d: parties %s dropped after sharing keys", self.round_idx, self.dropped)
        return list(self.survivors), list(self.dropped)

    def _take_accusations(
        self, step: str, accused: Mapping[int, Iterable[int]], masked: Mapping[int, torch.Tensor]
    ) -> set[int]:
        """The parties to drop for undecryptable shares: the one party an accuser names (the accuser's
        inbox loses it: it did not mask with it), or the accuser itself where it names several. An
        honest party meets a second bad sender only when several parties collude, so a party that
        names many is the suspect: otherwise one silo could empty a round by naming all its neighbours."""
        named: set[int] = set()
        for accuser, parties in sorted(accused.items()):
            parties = sorted(set(parties))
            if not parties:
                continue
            strangers = [v for v in parties if v not in self._inbox.get(accuser, set())]
            if accuser not in masked or strangers:
                raise self._fail(
                    step,
                    f"party {accuser} names parties {parties} for bad shares, but it sent no masked input "
                    f"or got no shares from {strangers}: refuse its message",
                )
            if len(parties) > 1:
                log.warning(
                    "round %d: party %d names %d parties %s for bad shares: it is dropped itself, its "
                    "accusations ignored",
                    self.round_idx,
                    accuser,
                    len(parties),
                    parties[:10],
                )
                named.add(accuser)
                continue
            self._inbox[accuser] -= set(parties)
            for v in parties:
                self.accused.setdefault(v, []).append(accuser)
            named |= set(parties)
        if named:
            log.warning(
                "round %d: parties %s are dropped from the round: a neighbour could not decrypt their "
                "shares (named by %s)",
                self.round_idx,
                sorted(named),
                {v: self.accused.get(v, "itself: it named several") for v in sorted(named)},
            )
        return named

    def unmask_request(self) -> tuple[list[int], list[int]]:
        """What every survivor is asked in round 3, the whole round's lists: (the survivors, the
        dropped); each party reveals its shares of the b_u of the survivors and of the s-seeds of the
        dropped among those it holds (`PartySession.unmask`), after checking the crowd rules itself.
        The parties named for bad shares that sent a masked input are asked too (`asked`): each
        reveals its own share of its own s-seed only, standing in for the share its accuser lost."""
        if self._sum is None:
            raise self._fail("unmasking", "unmask_request() comes after collect_masked()")
        return list(self.survivors), list(self.dropped)

    @property
    def asked(self) -> list[int]:
        """Who is sent the unmasking request: the survivors, and each named party whose s-seed the
        survivors hold fewer than t shares of (its accuser's is missing): only then is it asked for
        its own (`unmask_request`)."""
        t, alive = self.params.threshold, set(self.survivors)
        short = [v for v in self.named if sum(1 for u in alive if v in self.holds(u)) < t]
        return sorted({*self.survivors, *short})

    def unmask(self, responses: Mapping[int, dict]) -> torch.Tensor:
        """Round 3 (Unmasking; Bonawitz et al. 2017, Fig. 4, round 4): rebuilds b_u of every survivor and
        the s-seed of every dropped party from the shares that came back, each checked against b_commit
        or s_pk (wrong shares are stepped around where more than t came back, and their senders named:
        `Rebuilder`), and removes the masks. Returns the int64 sum in [0, 2^k) of the survivors'
        encoded inputs; a secret that cannot be rebuilt stops the round, no sum revealed."""
        step, k = "unmasking", self.params.encoding.k
        if self._sum is None or self._done:
            raise self._fail(step, "unmask() comes once, after collect_masked()")
        problem = round_problem(len(self.graph.order), self.graph.size(), self.params)
        problem = problem or survivors_problem(self.graph, self.survivors, self.params.min_group)
        if problem is not None:
            raise self._fail(step, problem)
        rebuilder = Rebuilder(self, responses)
        b_seeds, s_seeds = rebuilder.seeds()
        self.blamed = rebuilder.blamed
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

    def holds(self, party: int) -> set[int]:
        """The senders whose shares `party` holds (it masked with them), itself included."""
        return self._inbox.get(party, set()) | {party}

    def advertised(self, party: int) -> dict:
        """The keys `party` advertised this round."""
        return self._keys[party]
