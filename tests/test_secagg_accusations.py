"""A party named for bad shares misses that round only, at every round size the config accepts:
whether its accuser lies (an honest party named) or tells the truth (a sender that garbled one
ciphertext and otherwise follows the protocol), the round completes with the sum of everyone else.
Where the accuser's share of the named party's s-seed is missing and the survivors hold fewer than
t, the named party is asked for its own share of its own s-seed (never a b share). A sender that
garbles a ciphertext and then withholds its share stops a round whose neighbourhoods hold 3 or 4
parties: the documented limit, checked here too; and a round of exactly secagg_min_group parties
survives no missing party, named or dropped."""

from __future__ import annotations

import os

import pytest
import torch

from fedml_moon.privacy.mod import secagg_params
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.secagg import PartySession, SecAggError, ServerSession
from fedml_moon.privacy.secagg_graph import neighbourhood_size

LENGTH = 64
SIZES = [(n, k) for n in range(4, 10) for k in (0, 2, 4) if k == 0 or k < n - 1]  # 3: see the last test


def _round(n: int, k: int, garble: str, withhold: bool = False) -> tuple[ServerSession, dict, int]:
    """One round of n parties (SecAgg+ degree k, t auto). `garble`: "accuser" (party 0 garbles, in its
    own inbox, its lowest neighbour's ciphertext and names it: a false accusation) or "sender" (party
    0 sends its lowest neighbour garbage: a true one). Returns the server, the inputs, the named party."""
    params = secagg_params(PrivacyArgs(secure_aggregation=True, secagg_neighbours=k), n)
    parties = {u: PartySession(u, 0, params) for u in range(n)}
    server = ServerSession(0, params, LENGTH)
    g = torch.Generator().manual_seed(n * 10 + k)
    inputs = {u: torch.rand(LENGTH, generator=g, dtype=torch.float64) for u in range(n)}
    rosters, digests = server.collect_keys({u: p.advertise() for u, p in parties.items()})
    sent = {u: p.share(rosters[u], digests) for u, p in parties.items()}
    victim = min(sent[0])
    if garble == "sender":
        sent[0][victim] = os.urandom(len(sent[0][victim]))
    inboxes = server.route(sent)
    if garble == "accuser":
        inboxes[0][victim] = os.urandom(len(inboxes[0][victim]))
    masked = {u: parties[u].mask(inputs[u], inboxes[u]) for u in range(n)}
    server.collect_masked(masked, {u: parties[u].accused for u in range(n)})
    named = victim if garble == "accuser" else 0
    survivors, dropped = server.unmask_request()
    assert dropped == [named] and named not in survivors
    answering = [u for u in server.asked if not (withhold and u == named)]
    answers = {u: parties[u].unmask(survivors, dropped) for u in answering}
    if named in answers:  # asked for its own s-seed share, and only that
        assert answers[named]["b"] == {} and list(answers[named]["s"]) == [named]
    decoded = server.decode(server.unmask(answers))
    return server, {u: inputs[u] for u in survivors}, decoded


@pytest.mark.parametrize(("n", "k"), SIZES)
@pytest.mark.parametrize("garble", ["accuser", "sender"])
def test_a_named_party_misses_only_that_round_at_every_size(n, k, garble):
    server, honest, decoded = _round(n, k, garble)
    assert len(server.survivors) == n - 1
    bound = server.params.encoding.error_bound(n - 1)
    assert float((decoded - sum(honest.values())).abs().max()) <= bound


@pytest.mark.parametrize(("n", "k"), SIZES)
def test_a_garbling_sender_that_withholds_its_share_stops_only_neighbourhoods_of_3_or_4(n, k):
    size = neighbourhood_size(n, k)
    if size >= 5:
        server, honest, decoded = _round(n, k, "sender", withhold=True)
        assert float((decoded - sum(honest.values())).abs().max()) <= server.params.encoding.error_bound(
            n - 1
        )
        return
    with pytest.raises(SecAggError, match="fewer than the threshold"):
        _round(n, k, "sender", withhold=True)


def test_a_named_party_is_asked_only_when_the_survivors_hold_too_few_of_its_shares():
    """5 parties, t = 3: the survivors hold 3 shares of the named party's s-seed; it is not asked."""
    server, _, _ = _round(5, 0, "accuser")
    assert server.named and not set(server.named) & set(server.asked)
    server, _, _ = _round(4, 0, "accuser")  # 4 parties, t = 3: 2 held, so it is asked
    assert set(server.named) <= set(server.asked)


@pytest.mark.parametrize("garble", ["accuser", "sender"])
def test_a_round_of_exactly_the_minimum_group_survives_no_missing_party(garble):
    with pytest.raises(SecAggError, match="fewer than privacy_args.secagg_min_group=3"):
        _round(3, 0, garble)
