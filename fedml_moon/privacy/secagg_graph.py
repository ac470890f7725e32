"""The communication graph of one SecAgg+ round (Bell et al., CCS 2020, Sec. 3 and Sec. 4: a random
k-regular graph drawn per round) and the crowd rules every unmasking obeys, on the server and on each
party. Re-exported by `fedml_moon.privacy.secagg`.

The graph: a Harary graph (circulant, ceil(k / 2) neighbours on each side) over a pseudo-random order
of the participants. The order is drawn from a seed no one chooses alone: SHA-256 over the round
index and every participant's advertised keys (sorted by party id), so every party recomputes the
graph from the digests of the keys it is sent and checks the neighbourhood the server handed it. With
k = 0 or k >= n - 1 the graph is complete (SecAgg). A circulant with an even degree k is k-connected.

The crowd rules: unmasking is refused, revealing nothing, when
  - the round has fewer than 3 participants (or fewer than `min_group`), or t < 2, or t is not more
    than half of a neighbourhood (the party itself included): a server that tells half of a party's
    neighbours "it survived" and the other half "it dropped" would get t shares of both its secrets;
  - fewer than `min_group` parties' masked inputs are in the sum, or the survivors' subgraph is
    disconnected: masks between two survivors are never removed, so the only sum the server can form
    from the masked vectors of a connected set of survivors is their total, while each separate group
    of survivors could be summed alone.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fedml_moon.privacy.secagg_common import KEY_FIELDS, SecAggError, SecAggParams

DIGEST_BYTES = 32
_SEED_LABEL = b"fedml_moon secagg+ graph seed"
_ORDER_LABEL = b"fedml_moon secagg+ graph order"


def key_digest(keys: Mapping[str, bytes]) -> bytes:
    """SHA-256 over a party's advertised keys c_pk || s_pk || b_commit (what the roster relays for
    every participant so that each party can compute the round's graph seed)."""
    return hashlib.sha256(b"".join(keys[name] for name in KEY_FIELDS)).digest()


def graph_seed(round_idx: int, digests: Mapping[int, bytes]) -> bytes:
    """SHA-256 over the round index and every participant's (id, key digest), sorted by id: the seed
    of the round's graph, the same for every party that holds the same participants' keys."""
    h = hashlib.sha256(_SEED_LABEL + struct.pack(">q", round_idx))
    for party in sorted(digests):
        h.update(struct.pack(">q", party) + digests[party])
    return h.digest()


def neighbourhood_size(participants: int, k: int) -> int:
    """How many parties a neighbourhood holds, the party itself included: n for the complete graph
    (k = 0 or k >= n - 1), else 2 ceil(k / 2) + 1."""
    if k == 0 or k >= participants - 1:
        return participants
    return min(participants, 2 * ((k + 1) // 2) + 1)


def harary(order: Sequence[int], k: int) -> dict[int, frozenset[int]]:
    """Each party's neighbours in the circulant over `order` as given: ceil(k / 2) on each side,
    wrapping around; every other party when k = 0 or k >= n - 1."""
    ids, n = list(order), len(order)
    if len(set(ids)) != n:
        raise SecAggError(f"the graph's order repeats a party: {sorted(ids)}")
    if k == 0 or k >= n - 1:
        return {u: frozenset(ids) - {u} for u in ids}
    half = (k + 1) // 2
    out = {}
    for at, u in enumerate(ids):
        near = {ids[(at + d) % n] for d in range(1, half + 1)} | {
            ids[(at - d) % n] for d in range(1, half + 1)
        }
        out[u] = frozenset(near - {u})
    return out


@dataclass(frozen=True)
class RoundGraph:
    """The graph of one round: its seed, the participants' order it drew, each party's neighbours."""

    round_idx: int
    seed: bytes
    order: tuple[int, ...]
    neighbours: Mapping[int, frozenset[int]]

    @classmethod
    def draw(cls, round_idx: int, digests: Mapping[int, bytes], k: int) -> RoundGraph:
        """Bell et al. 2020, Sec. 4 (a random graph per round): the Harary graph of degree k over the
        participants ordered by SHA-256(label || seed || id), the seed from `graph_seed`."""
        for party, digest in digests.items():
            if type(party) is not int or not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
                raise SecAggError(
                    f"round {round_idx}: the participants' key digests must be {DIGEST_BYTES} bytes under "
                    f"integer ids; got {party!r}: {type(digest).__name__}"
                )
        seed = graph_seed(round_idx, digests)
        order = tuple(
            sorted(digests, key=lambda p: hashlib.sha256(_ORDER_LABEL + seed + struct.pack(">q", p)).digest())
        )
        return cls(round_idx, seed, order, harary(order, k))

    @property
    def participants(self) -> list[int]:
        return sorted(self.order)

    def members(self, party: int) -> list[int]:
        """`party`'s neighbourhood and itself, sorted: the holders of its shares."""
        if party not in self.neighbours:
            raise SecAggError(
                f"round {self.round_idx}: party {party} is not among the round's {len(self.order)} "
                f"participants ({self.participants[:10]}...)"
            )
        return sorted([*self.neighbours[party], party])

    def size(self) -> int:
        """The neighbourhood size (the party itself included); the same for every party."""
        return min((len(v) + 1 for v in self.neighbours.values()), default=0)

    def components(self, alive: Iterable[int]) -> list[list[int]]:
        """The connected components of the subgraph over `alive`, each sorted, largest first."""
        left, out = set(alive), []
        while left:
            start = min(left)
            seen, todo = {start}, [start]
            while todo:
                u = todo.pop()
                for v in self.neighbours.get(u, ()):
                    if v in left and v not in seen:
                        seen.add(v)
                        todo.append(v)
            left -= seen
            out.append(sorted(seen))
        return sorted(out, key=lambda c: (-len(c), c))


def round_problem(participants: int, size: int, params: SecAggParams) -> str | None:
    """Why a round of `participants` with neighbourhoods of `size` (itself included) cannot run under
    `params`, or None: fewer than 3 (or min_group) participants, t < 2, t <= size / 2, t > size."""
    t, floor = params.threshold, max(3, params.min_group)
    if participants < floor:
        return (
            f"{participants} participants, fewer than {floor} (at least 3, and privacy_args.secagg_min_group="
            f"{params.min_group}): with one the server reads its input, with two each learns the other's "
            "from the sum; the round cannot be aggregated securely"
        )
    if t < 2:
        return f"the threshold t={t} is below 2: one share would give a secret away; raise secagg_threshold"
    if 2 * t <= size:
        return (
            f"the threshold t={t} is not more than half of a neighbourhood of {size} (itself included): a "
            "server telling some neighbours a party survived and others that it dropped would rebuild both "
            f"of its secrets; set privacy_args.secagg_threshold above {size // 2} (or auto)"
        )
    if t > size:
        return (
            f"the threshold t={t} exceeds the neighbourhood of {size} (itself included): no secret could be "
            "rebuilt; lower privacy_args.secagg_threshold or raise secagg_neighbours"
        )
    return None


def survivors_problem(graph: RoundGraph, survivors: Iterable[int], min_group: int) -> str | None:
    """Why the masked inputs of `survivors` must not be unmasked, or None: fewer than `min_group` of
    them, or a survivors' subgraph in separate groups (each of which the server could sum alone)."""
    alive = sorted(set(survivors))
    if len(alive) < min_group:
        return (
            f"only {len(alive)} parties' masked inputs are in the sum ({alive}), fewer than "
            f"privacy_args.secagg_min_group={min_group}: unmasking would reveal the sum of too small a "
            "group; refusing, nothing revealed"
        )
    groups = graph.components(alive)
    if len(groups) > 1:
        shown = "; ".join(str(g[:10]) for g in groups[:5])
        return (
            f"the survivors fall into {len(groups)} separate groups of the round's graph ({shown}): the "
            "server could sum each group alone; refusing to unmask, nothing revealed (raise "
            "secagg_neighbours for a better-connected graph)"
        )
    return None


def reveal_problem(
    graph: RoundGraph,
    party: int,
    held: set[int],
    survivors: Iterable[int],
    dropped: Iterable[int],
    params: SecAggParams,
) -> str | None:
    """Why `party`, holding the shares of the senders `held` (those it masked with), must not answer
    an unmasking request naming the round's `survivors` and `dropped` (Bonawitz et al. 2017, Fig. 4,
    round 4, with SecAgg+'s graph), or None: overlapping or foreign lists, the round or the survivors
    below the crowd rules, a sender it holds left unclassified, a neighbour listed as a survivor that it
    did not mask with, or fewer than t survivors around it."""
    alive, gone = set(survivors), set(dropped)
    listed = None if party in alive else "it is answering, so it must be listed as a survivor, not dropped"
    problem = _lists_problem(graph, alive, gone, listed) or _crowd_problem(graph, alive, params)
    if problem is not None:
        return problem
    unsaid = held - alive - gone - {party}
    if unsaid:
        return (
            f"the request does not say whether parties {sorted(unsaid)[:10]} survived, whose shares it "
            "holds: refusing to reveal"
        )
    unmasked = (alive & graph.neighbours[party]) - held
    if unmasked:
        return (
            f"parties {sorted(unmasked)[:10]} are listed as survivors, but this party did not mask with them "
            "(their shares did not open or never came): refusing to reveal"
        )
    here = len(alive & set(graph.members(party)))
    if here < params.threshold:
        return (
            f"only {here} of its neighbourhood + itself survive, fewer than the threshold "
            f"t={params.threshold}: refusing to reveal; the round cannot be completed"
        )
    return None


def own_seed_problem(
    graph: RoundGraph, party: int, survivors: Iterable[int], dropped: Iterable[int], params: SecAggParams
) -> str | None:
    """Why `party`, listed as dropped after its masked input (a neighbour named it), must not reveal its
    own share of its own s-seed for a request naming `survivors` and `dropped`, or None: the lists or
    the round below what every unmasking answer requires (`reveal_problem`'s checks of the request)."""
    alive, gone = set(survivors), set(dropped)
    listed = None if party in gone else "it is not listed as dropped, so no share of its own s-seed"
    return _lists_problem(graph, alive, gone, listed) or _crowd_problem(graph, alive, params)


def _lists_problem(graph: RoundGraph, alive: set[int], gone: set[int], listed: str | None) -> str | None:
    """A request's lists that overlap or name strangers, or (`listed`) that place the answering party
    where its answer cannot come from."""
    if alive & gone:
        return f"parties {sorted(alive & gone)[:10]} are both survivors and dropped: refusing to reveal"
    strangers = (alive | gone) - set(graph.neighbours)
    if strangers:
        return f"parties {sorted(strangers)[:10]} are not participants of the round: refusing to reveal"
    return None if listed is None else f"{listed}: refusing to reveal"


def _crowd_problem(graph: RoundGraph, alive: set[int], params: SecAggParams) -> str | None:
    """The round or its survivors below the crowd rules."""
    return round_problem(len(graph.order), graph.size(), params) or survivors_problem(
        graph, alive, params.min_group
    )
