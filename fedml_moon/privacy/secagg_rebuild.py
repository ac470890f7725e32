"""The server's rebuilding of the round's secrets at unmasking (Bonawitz et al., CCS 2017, Fig. 4,
round 4: "reconstruct b_u for the survivors, s_u^SK for the dropped"), robust to wrong shares: each
secret is checked against what its owner advertised (b_commit, s_pk); where more than t shares of it
came back, a t-subset that rebuilds the advertised secret is searched for (`shamir.recover`, bounded),
and the parties whose shares are off its polynomial are named. Only a secret that cannot be rebuilt
stops the round, naming its owner, the parties whose shares came back and the reason."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fedml_moon.core import shamir
from fedml_moon.privacy import secagg_crypto as crypto
from fedml_moon.privacy.secagg_common import share_index


class Session(Protocol):
    """What rebuilding reads of the round's `secagg_server.ServerSession` (named here, not imported,
    so that the two modules do not import each other)."""

    round_idx: int
    params: Any
    graph: Any
    survivors: list[int]
    dropped: list[int]
    named: list[int]  # dropped after their masked input: they answer with their own s-seed share

    def holds(self, party: int) -> set[int]: ...

    def advertised(self, party: int) -> dict: ...

    def _fail(self, step: str, what: str) -> Exception: ...


log = logging.getLogger(__name__)
Points = dict[int, tuple[int, int]]  # responder -> its (x, y) share of one secret
COMMITMENT = {"b-seed": "b_commit", "s-seed": "s_pk"}


class Rebuilder:
    """The secrets of one round's unmasking from the survivors' `responses` (responder -> unmask()'s
    {"b": {owner: (x, y)}, "s": {owner: (x, y)}}): b_u of every survivor, the s-seed of every dropped
    party some survivor masked with; `blamed`: responder -> what it got wrong."""

    def __init__(self, session: Session, responses: Mapping[int, object]) -> None:
        self.session, self.t = session, session.params.threshold
        self.blamed: dict[int, list[str]] = {}
        self.b_points: dict[int, Points] = {u: {} for u in session.survivors}
        masked_with = set().union(*(session.holds(u) for u in session.survivors))
        self.s_points: dict[int, Points] = {v: {} for v in session.dropped if v in masked_with}
        for w, answer in sorted(responses.items()):
            self._take(w, answer)

    def _blame(self, party: int, what: str) -> None:
        self.blamed.setdefault(party, []).append(what)

    def _take(self, w: int, answer: object) -> None:
        """One responder's shares, each checked for shape, holder and x coordinate; a wrong one is left
        out and its sender named."""
        if w not in self.session.survivors and w not in self.session.named:
            log.warning(
                "round %d: party %s answered the unmasking but is not a survivor: ignored",
                self.session.round_idx,
                w,
            )
            return
        if not isinstance(answer, Mapping) or set(answer) != {"b", "s"}:
            self._blame(w, "its answer is not unmask()'s {'b': ..., 's': ...} dict")
            return
        if w not in self.session.survivors:  # a named party: its own s-seed share, nothing else
            own = isinstance(answer["s"], Mapping) and set(answer["s"]) <= {w} and not answer["b"]
            if not own:
                self._blame(w, "a party named for bad shares may reveal its own s-seed share only")
                return
        for kind, wanted in (("b", self.b_points), ("s", self.s_points)):
            given = answer[kind]
            if not isinstance(given, Mapping):
                self._blame(w, f"its {kind!r} shares are not a dict")
                continue
            for owner, share in given.items():
                problem = self._share_problem(w, owner, share, wanted)
                if problem is None:
                    wanted[owner][w] = (share[0], share[1])
                else:
                    self._blame(w, problem)

    def _share_problem(self, w: int, owner: object, share: object, wanted: dict[int, Points]) -> str | None:
        if owner not in wanted:
            return f"it returned a share for party {owner}, which the server did not ask for"
        ok = isinstance(share, tuple | list) and len(share) == 2 and all(type(c) is int for c in share)
        if not ok or not 0 <= share[1] < shamir.P:
            return f"its share for party {owner} is not an (x, y) pair in the field"
        if owner not in self.session.holds(w):
            return f"it returned a share for party {owner}, whose shares it does not hold"
        if share[0] != share_index(self.session.graph.members(owner), w):
            return f"its share for party {owner} has the wrong x = {share[0]}"
        return None

    def seeds(self) -> tuple[dict[int, int], dict[int, int]]:
        """(b_u of every survivor, the s-seed of every dropped party); a SecAggError naming every
        secret that cannot be rebuilt, and why, when one cannot."""
        failures: list[tuple[str, int, list[int], str]] = []
        out: dict[str, dict[int, int]] = {"b-seed": {}, "s-seed": {}}
        for what, points, check in (
            ("b-seed", self.b_points, self._b_check),
            ("s-seed", self.s_points, self._s_check),
        ):
            for owner, given in sorted(points.items()):
                secret = self._rebuild(what, owner, given, check(owner), failures)
                if secret is not None:
                    out[what][owner] = secret
        if failures:
            said = "; ".join(self._explain(*f) for f in failures)
            raise self.session._fail("unmasking", f"{said}: no sum this round, nothing revealed")
        if self.blamed:
            log.warning(
                "round %d: unmasking went on without wrong shares from parties %s: %s",
                self.session.round_idx,
                sorted(self.blamed),
                {p: what[:3] for p, what in sorted(self.blamed.items())},
            )
        return out["b-seed"], out["s-seed"]

    def _rebuild(
        self, what: str, owner: int, points: Points, check: Callable[[int], bool], failures: list
    ) -> int | None:
        givers = sorted(points)
        if len(givers) < self.t:
            failures.append((what, owner, givers, "few"))
            return None
        try:
            secret, off = shamir.recover([points[w] for w in givers], self.t, check)
        except shamir.ShareError as exc:
            failures.append((what, owner, givers, str(exc)))
            return None
        for i in off:
            self._blame(givers[i], f"its share of party {owner}'s {what} is off the polynomial")
        return secret

    def _explain(self, what: str, owner: int, givers: list[int], reason: str) -> str:
        t = self.t
        if reason == "few":
            return (
                f"only {len(givers)} shares of party {owner}'s {what} came back (from parties {givers}), "
                f"fewer than the threshold t={t}: the sum cannot be recovered"
            )
        known = sorted(set(givers) & set(self.blamed))
        if known:
            blame = f"the shares from parties {known} are wrong"
        elif len(givers) == t:
            blame = (
                f"exactly t={t} came back, so the wrong one cannot be told: one of parties {givers} sent it"
            )
        else:
            blame = f"too many of them are wrong ({reason})"
        return (
            f"party {owner}'s {what} rebuilt from the shares of parties {givers} does not match what it "
            f"advertised ({COMMITMENT[what]}): {blame}"
        )

    def _b_check(self, u: int) -> Callable[[int], bool]:
        commitment = self.session.advertised(u)["b_commit"]
        return lambda secret: crypto.commit(secret) == commitment

    def _s_check(self, v: int) -> Callable[[int], bool]:
        s_pk = self.session.advertised(v)["s_pk"]
        return lambda seed: crypto.public_bytes(crypto.s_key_from_seed(seed)) == s_pk
