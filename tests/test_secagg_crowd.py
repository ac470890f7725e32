"""The curious server's side: from everything it receives in a round (the roster, the masked vectors,
the shares revealed to it) it tries to solve for the sum of a smaller group than the survivors. It
strips every mask it can (the self-masks and the dropped parties' pairwise masks it can rebuild) and
sums the masked vectors of each candidate group; the round's crowd rules (`secagg_graph`) leave it
nothing but the survivors' total: unmasking is refused when the survivors' subgraph is split or below
`secagg_min_group`, and a threshold above half of each neighbourhood keeps an inconsistent server
from rebuilding both of a party's secrets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedml_moon.core import shamir
from fedml_moon.privacy import secagg_crypto as crypto
from fedml_moon.privacy.secagg import SecAggError, SecAggParams
from fedml_moon.privacy.secagg_graph import RoundGraph, neighbourhood_size, reveal_problem
from tests.support.secagg import Round

LENGTH = 16


def _rebuilt(r: Round, kind: str) -> dict[int, int]:
    """The secrets of `kind` ("b" or "s") the server can rebuild from the shares revealed to it."""
    points: dict[int, list] = {}
    for answer in r.answers.values():
        for owner, share in answer[kind].items():
            points.setdefault(owner, []).append(share)
    t = r.params.threshold
    return {owner: shamir.combine(p, t) for owner, p in points.items() if len(p) >= t}


def _stripped(r: Round) -> dict[int, np.ndarray]:
    """Each received masked vector less every mask the server can remove: PRG(b_u) where it rebuilt
    b_u, and every pairwise mask of a pair one of whose s-seeds it rebuilt. Vectors whose self-mask
    it cannot remove are left out (they hide their input whatever is summed with them)."""
    k, b, s = r.params.encoding.k, _rebuilt(r, "b"), _rebuilt(r, "s")
    keys = {u: p.advertise() for u, p in r.parties.items()}
    out = {}
    for u, y in r.masked_inputs.items():
        if u not in b:
            continue
        acc = y.numpy().astype(crypto.word_dtype(k))
        acc -= crypto.prg(crypto.self_seed(b[u], r.round_idx), LENGTH, k)
        for v in r.server.holds(u) - {u}:  # the senders u masked with
            owner, other = (v, u) if v in s else (u, v) if u in s else (None, None)
            if owner is None:
                continue
            key = crypto.s_key_from_seed(s[owner])
            pair = crypto.pair_seed(key, keys[other]["s_pk"], r.round_idx, owner, other)
            acc = acc - crypto.prg(pair, LENGTH, k) if v > u else acc + crypto.prg(pair, LENGTH, k)
        out[u] = acc
    return out


def _groups_solved(r: Round) -> list[tuple[int, ...]]:
    """Every group of parties whose sum of stripped vectors is the sum of their encoded inputs."""
    k, stripped = r.params.encoding.k, _stripped(r)
    encoded = {
        u: r.params.encoding.encode(x).numpy().astype(crypto.word_dtype(k)) for u, x in r.inputs.items()
    }
    solved = []
    for size in range(1, len(stripped) + 1):
        for group in itertools.combinations(sorted(stripped), size):
            guess = crypto.reduce(sum(stripped[u] for u in group), k)
            if np.array_equal(guess, crypto.reduce(sum(encoded[u] for u in group), k)):
                solved.append(group)
    return solved


def _connected(r: Round, alive: list[int]) -> bool:
    """Breadth-first search over the round's graph restricted to `alive` (independent of the code's)."""
    if not alive:
        return False
    seen, todo = {alive[0]}, [alive[0]]
    while todo:
        for v in r.server.graph.neighbours[todo.pop()]:
            if v in alive and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen == set(alive)


def _issue_round() -> tuple[Round, list[int]]:
    """10 parties, 2 neighbours (a cycle over the drawn order), 3 dropped that split the survivors into
    groups of 3, 2 and 2 (the report's case: x3 + x4 and x6 + x7 came out)."""
    r = Round(10, SecAggParams(threshold=2, neighbours=2), length=LENGTH)
    r.keys()
    order = r.server.graph.order
    return r, [order[2], order[5], order[8]]


def test_dropouts_that_split_the_survivors_leave_the_server_no_group_sum():
    r, gone = _issue_round()
    with pytest.raises(SecAggError, match=r"survivors fall into 3 separate groups .*nothing revealed"):
        r.collect(skip_mask=gone)
    alive = [u for u in range(10) if u not in gone]
    for u in alive:  # asked anyway, with the true lists, every survivor refuses
        with pytest.raises(SecAggError, match="separate groups"):
            r.parties[u].unmask(alive, gone)
    assert r.answers == {} and _groups_solved(r) == []  # masked vectors alone give nothing


def test_one_dropout_in_a_cycle_leaves_a_path_and_only_the_survivors_total():
    r, gone = _issue_round()
    r.responses(skip_mask=gone[:1])
    total = r.server.unmask(r.answers)
    survivors = [u for u in range(10) if u != gone[0]]
    assert r.server.survivors == survivors and _groups_solved(r) == [tuple(survivors)]
    assert float((r.server.decode(total) - r.exact()).abs().max()) <= r.params.encoding.error_bound(9)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 10),
    k=st.integers(0, 10),
    group=st.integers(2, 4),
    data=st.data(),
)
def test_whenever_the_round_unmasks_the_only_sum_is_the_connected_crowds_total(n, k, group, data):
    """Any n, k, min_group, dropouts before masking and silences at unmasking: the round unmasks only
    when the survivors' subgraph is connected with >= min_group parties, and from all it received the
    server solves for no group but the survivors (and for none when the round stopped)."""
    gone = data.draw(st.sets(st.integers(0, n - 1), max_size=n), label="dropped before masking")
    silent = data.draw(st.sets(st.integers(0, n - 1), max_size=n), label="silent at unmasking")
    size = neighbourhood_size(n, k)
    params = SecAggParams(threshold=size // 2 + 1, neighbours=k, min_group=min(group, n))
    r = Round(n, params, length=LENGTH)
    alive = [u for u in range(n) if u not in gone]
    try:
        survivors, dropped = r.collect(skip_mask=gone)
    except SecAggError:
        event("refused before any share is revealed")
        assert not (_connected(r, alive) and len(alive) >= params.min_group)
        assert _groups_solved(r) == []
        return
    assert survivors == alive and _connected(r, alive) and len(alive) >= params.min_group
    for u in survivors:
        if u not in silent:
            try:
                r.answers[u] = r.parties[u].unmask(survivors, dropped)
            except SecAggError:
                pass  # too few of its neighbourhood left: it reveals nothing
    try:
        r.server.unmask(r.answers)
        unmasked = True
    except SecAggError:
        unmasked = False
    event("unmasked" if unmasked else "stopped at unmasking: a secret short of t shares")
    assert _groups_solved(r) == ([tuple(alive)] if unmasked else [])


def _lie_about_party_0(told_survived: set[int], t: int) -> tuple[int, int]:
    """A complete round of 5 with threshold t: the server tells `told_survived` (of party 0's
    neighbours 1..4) that party 0 survived and the rest that it dropped. Returns how many shares of
    b_0 and of party 0's s-seed it collects."""
    r = Round(5, SecAggParams(threshold=t), length=LENGTH)
    r.collect()
    b_shares = [r.parties[0].unmask(list(range(5)), [])["b"][0]]  # party 0 answers for itself
    s_shares = []
    for v in range(1, 5):
        if v in told_survived:
            b_shares.append(r.parties[v].unmask(list(range(5)), [])["b"][0])
        else:
            s_shares.append(r.parties[v].unmask([1, 2, 3, 4], [0])["s"][0])
    if len(s_shares) < t:
        with pytest.raises(shamir.ShareError, match="cannot give the secret back"):
            shamir.combine(s_shares, t)
    return len(b_shares), len(s_shares)


def test_an_inconsistent_server_cannot_reach_t_shares_of_both_of_a_partys_secrets():
    """t = 3 of 5 (more than half): whichever neighbours hear "survived", the b-shares (with party 0's
    own) and the s-shares never both reach t; the s-seed short of t is perfectly hidden."""
    for told in itertools.chain.from_iterable(itertools.combinations(range(1, 5), m) for m in range(5)):
        b_count, s_count = _lie_about_party_0(set(told), 3)
        assert b_count + s_count == 5 and not (b_count >= 3 and s_count >= 3), told


def test_a_threshold_of_half_a_neighbourhood_or_less_is_refused_everywhere():
    with pytest.raises(SecAggError, match=r"t=2 is not more than half of a neighbourhood of 5"):
        Round(5, SecAggParams(threshold=2)).keys()
    r = Round(5, SecAggParams(threshold=3))
    rosters = r.keys()
    r.parties[0].params = SecAggParams(threshold=2)  # a party whose own config says t = 2
    with pytest.raises(
        SecAggError, match=r"party 0: the threshold t=2 is not more than half .*refusing to share"
    ):
        r.parties[0].share(rosters[0], r.digests)


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_participants_are_refused_by_the_server_and_by_the_parties(n):
    r = Round(n, SecAggParams(threshold=2))
    with pytest.raises(SecAggError, match=f"{n} participants, fewer than 3"):
        r.keys()
    three = Round(3, SecAggParams(threshold=2))
    rosters = three.keys()
    few = {u: d for u, d in three.digests.items() if u < n}
    with pytest.raises(SecAggError, match=f"{n} participants, fewer than 3.*refusing to share"):
        three.parties[0].share({u: k for u, k in rosters[0].items() if u < n}, few)
    graph = RoundGraph.draw(0, few, 0)  # and at unmasking, whatever the server's lists say
    problem = reveal_problem(graph, 0, set(range(n)), list(range(n)), [], SecAggParams(threshold=2))
    assert problem is not None and problem.startswith(f"{n} participants, fewer than 3")
