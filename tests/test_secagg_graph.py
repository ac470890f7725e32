"""The round's SecAgg+ graph (Bell et al., CCS 2020, Sec. 4: a random graph per round): a Harary graph
over an order drawn from SHA-256 of the round index and every participant's keys, so the server does
not choose it. Every party draws the same graph as the server from the digests it is sent and refuses
a roster that hands it another neighbourhood; the graph changes with the round and with the keys, and
it stays connected (k-connected for an even k) whatever order is drawn."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedml_moon.privacy.secagg import SecAggError, SecAggParams
from fedml_moon.privacy.secagg_graph import RoundGraph, graph_seed, harary, key_digest, neighbourhood_size
from tests.support.secagg import Round


def _digests(n: int, salt: int = 0) -> dict[int, bytes]:
    return {p: hashlib.sha256(f"{salt}:{p}".encode()).digest() for p in range(n)}


def test_the_circulant_over_a_given_order_is_symmetric_with_k_rounded_up_to_even():
    order = [3, 10, 11, 20, 42, 50, 51, 60]
    assert harary(order, 2)[3] == {10, 60}
    assert harary(order, 3)[3] == harary(order, 4)[3] == {10, 11, 51, 60}
    assert harary(order, 0)[20] == harary(order, 7)[20] == {3, 10, 11, 42, 50, 51, 60}
    shuffled = [60, 3, 51, 10]
    assert harary(shuffled, 2)[3] == {60, 51}  # the order as given, not sorted
    for graph in (harary(order, 4), harary(shuffled, 2)):
        assert all(u in graph[v] for u in graph for v in graph[u])
    with pytest.raises(SecAggError, match="repeats a party"):
        harary([1, 2, 2], 2)


def test_the_seed_covers_the_round_and_every_participants_keys_whatever_their_order():
    digests = _digests(5)
    reordered = dict(reversed(list(digests.items())))
    assert graph_seed(3, digests) == graph_seed(3, reordered)
    assert graph_seed(3, digests) != graph_seed(4, digests)
    assert graph_seed(3, digests) != graph_seed(3, {**digests, 2: hashlib.sha256(b"other").digest()})
    assert graph_seed(3, digests) != graph_seed(3, {p: d for p, d in digests.items() if p != 4})


def test_every_party_draws_the_servers_graph_from_the_digests_it_is_sent():
    r = Round(12, SecAggParams(threshold=3, neighbours=4))
    r.share()
    server = r.server.graph
    assert server == RoundGraph.draw(0, r.digests, 4)
    assert r.digests == {u: key_digest(p.advertise()) for u, p in r.parties.items()}
    assert all(p.graph == server for p in r.parties.values())
    assert server.order != tuple(range(12))  # drawn, not the sorted ids (1 chance in 12!)


def test_a_roster_with_another_neighbourhood_than_the_graphs_is_refused():
    """A server that hands party 0 the fixed circulant over sorted ids (its old graph), or any
    neighbourhood of its choosing, is refused: the party draws the graph itself."""
    r = Round(10, SecAggParams(threshold=2, neighbours=2))
    rosters = r.keys()
    keys = {u: p.advertise() for u, p in r.parties.items()}
    chosen = [0, 1, 9] if sorted(rosters[0]) != [0, 1, 9] else [0, 2, 8]
    with pytest.raises(
        SecAggError, match=r"party 0: the roster hands it the neighbourhood \[.*\], but the round"
    ):
        r.parties[0].share({v: keys[v] for v in chosen}, r.digests)
    neighbour = next(v for v in sorted(rosters[0]) if v != 0)
    forged = {**r.digests, neighbour: hashlib.sha256(b"a key set of the server's choosing").digest()}
    with pytest.raises(SecAggError, match=f"party {neighbour}'s keys in the roster do not match its digest"):
        r.parties[0].share(rosters[0], forged)
    # another digest moves the graph; one that moves party 0's neighbourhood is refused (one that
    # leaves it where it was gives the server nothing: party 0 shares with its true neighbours)
    other = next(v for v in range(10) if v not in rosters[0])
    for salt in range(1000):
        forged = {**r.digests, other: hashlib.sha256(f"forged {salt}".encode()).digest()}
        if RoundGraph.draw(r.parties[0].round_idx, forged, 2).members(0) != sorted(rosters[0]):
            break
    else:
        pytest.fail("no forged digest in 1000 moved party 0's neighbourhood")
    with pytest.raises(SecAggError, match="the roster hands it the neighbourhood"):
        r.parties[0].share(rosters[0], forged)
    with pytest.raises(SecAggError, match="do not hold the digest of the keys it advertised"):
        r.parties[0].share(rosters[0], {**r.digests, 0: bytes(32)})
    assert r.parties[0].share(rosters[0], r.digests)  # the refusals used up nothing


def test_the_graph_differs_between_rounds_and_between_key_sets():
    digests = _digests(20)
    graphs = [RoundGraph.draw(i, digests, 4) for i in range(5)]
    graphs += [RoundGraph.draw(0, _digests(20, salt), 4) for salt in range(1, 5)]
    neighbourhoods = {tuple(sorted((u, tuple(sorted(v))) for u, v in g.neighbours.items())) for g in graphs}
    assert len(neighbourhoods) == len(graphs)
    a, b = (
        Round(10, SecAggParams(threshold=2, neighbours=2)),
        Round(10, SecAggParams(threshold=2, neighbours=2)),
    )
    a.keys(), b.keys()
    assert a.server.graph.neighbours != b.server.graph.neighbours  # fresh keys every round


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 40), k=st.integers(1, 45), salt=st.integers(0, 10**6), data=st.data())
def test_the_graph_is_regular_symmetric_and_survives_fewer_removals_than_its_degree(n, k, salt, data):
    graph = RoundGraph.draw(salt % 7, _digests(n, salt), k)
    degree = n - 1 if k >= n - 1 else min(n - 1, 2 * ((k + 1) // 2))
    assert all(len(near) == degree for near in graph.neighbours.values())
    assert graph.size() == neighbourhood_size(n, k) == degree + 1
    assert all(u in graph.neighbours[v] for u in graph.neighbours for v in graph.neighbours[u])
    assert graph.components(range(n)) == [list(range(n))]
    removed = data.draw(st.sets(st.integers(0, n - 1), max_size=max(degree - 1, 0)))
    left = [u for u in range(n) if u not in removed]
    assert len(graph.components(left)) == 1  # a Harary graph of even degree d is d-connected


def test_a_cycle_is_cut_by_two_removals_and_a_degree_four_graph_is_not():
    graph = RoundGraph.draw(0, _digests(10), 2)
    order = graph.order
    assert len(graph.components([u for u in order if u not in (order[0], order[5])])) == 2
    graph = RoundGraph.draw(0, _digests(10), 4)
    for cut in itertools.combinations(range(10), 3):
        assert len(graph.components([u for u in range(10) if u not in cut])) == 1
