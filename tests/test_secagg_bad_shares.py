"""Hostile parties with valid keys against a round in process: one that sends a neighbour a garbage
ciphertext is named by it and dropped, and the round gives the honest parties' sum (within the
fixed-point bound) when they still meet the thresholds; one that returns wrong shares at unmasking
is outvoted where more than t shares of the secret came back, and named; with exactly t the round
stops naming the secret's owner and the parties that could have sent the wrong share, no sum."""

from __future__ import annotations

import os

import pytest

from fedml_moon.core.shamir import P
from fedml_moon.privacy.secagg import SecAggError, SecAggParams
from tests.support.secagg import Round, assert_within_bound


def _garbled(r: Round, sender: int, receiver: int) -> dict[int, dict[int, bytes]]:
    """The round's inboxes with `sender`'s ciphertext to `receiver` replaced by random bytes."""
    inboxes = r.inboxes()
    inboxes[receiver][sender] = os.urandom(len(inboxes[receiver][sender]))
    return inboxes


@pytest.mark.parametrize(("n", "k", "t"), [(6, 0, 4), (10, 4, 3)])
def test_garbage_to_one_neighbour_drops_its_sender_and_the_honest_parties_sum(n, k, t, caplog):
    r = Round(n, SecAggParams(threshold=t, neighbours=k))
    r.keys()
    accuser = min(r.server.graph.neighbours[2])
    survivors, dropped = r.collect(inboxes=_garbled(r, 2, accuser))
    assert r.parties[accuser].accused == [2] and r.server.accused == {2: [accuser]}
    assert 2 not in survivors and 2 in dropped and 2 in r.masked_inputs  # its vector came, left out
    r.answers = {u: r.parties[u].unmask(survivors, dropped) for u in survivors}
    assert all(2 not in a["b"] for a in r.answers.values())  # never asked for its self-mask seed
    assert 2 not in r.answers[accuser]["s"] and sum(2 in a["s"] for a in r.answers.values()) >= t
    assert_within_bound(r, r.server.decode(r.server.unmask(r.answers)))
    assert "parties [2] are dropped from the round: a neighbour could not decrypt" in caplog.text


def test_garbage_that_leaves_too_few_holders_of_the_senders_seed_stops_the_round():
    """4 parties, t = 3: without the accuser only 2 hold party 2's s-seed shares; the round stops
    naming it, no sum."""
    r = Round(4, SecAggParams(threshold=3))
    responses = r.responses(inboxes=_garbled(r, 2, 0))
    with pytest.raises(
        SecAggError, match=r"only 2 shares of party 2's s-seed came back .*t=3.*nothing revealed"
    ):
        r.server.unmask(responses)


def _tamper(answer: dict, kind: str, owner: int) -> None:
    x, y = answer[kind][owner]
    answer[kind][owner] = (x, (y + 1) % P)


def test_wrong_unmasking_shares_are_outvoted_with_more_than_t_and_their_senders_named():
    """5 parties, t = 3, party 4 dropped before masking: 4 shares come back of each survivor's b_u and
    of party 4's s-seed; parties 2 and 1 lie about one each."""
    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(skip_mask=(4,))
    _tamper(responses[2], "b", 0)
    _tamper(responses[1], "s", 4)
    responses[3]["b"][1] = (99, 1)  # a share with the wrong x
    assert_within_bound(r, r.server.decode(r.server.unmask(responses)))
    blamed = r.server.blamed
    assert sorted(blamed) == [1, 2, 3]
    assert blamed[2] == ["its share of party 0's b-seed is off the polynomial"]
    assert blamed[1] == ["its share of party 4's s-seed is off the polynomial"]
    assert blamed[3] == ["its share for party 1 has the wrong x = 99"]


def test_a_wrong_share_among_exactly_t_stops_the_round_naming_the_owner_and_the_senders():
    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(silent=(3, 4))
    _tamper(responses[2], "b", 0)
    with pytest.raises(
        SecAggError,
        match=r"party 0's b-seed rebuilt from the shares of parties \[0, 1, 2\] does not match what it "
        r"advertised \(b_commit\): exactly t=3 came back, .*one of parties \[0, 1, 2\].*nothing revealed",
    ):
        r.server.unmask(responses)


def test_a_liar_caught_on_other_secrets_is_named_where_only_t_came_back():
    """Party 2 lies on every b-share; party 3 leaves out its share of b_0, so only t = 3 of b_0 come
    back: the round stops, naming party 2, caught on the secrets that had a spare share."""
    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(silent=(4,))
    for owner in responses[2]["b"]:
        _tamper(responses[2], "b", owner)
    del responses[3]["b"][0]
    with pytest.raises(SecAggError, match=r"party 0's b-seed .*: the shares from parties \[2\] are wrong"):
        r.server.unmask(responses)


def test_malformed_answers_are_left_out_and_named():
    r = Round(6, SecAggParams(threshold=4))
    responses = r.responses()
    responses[5] = {"b": "not a dict", "s": {}}
    responses[4]["b"][0] = ("x", 1)
    r.server.unmask(responses)
    assert r.server.blamed[5] == ["its 'b' shares are not a dict"]
    assert r.server.blamed[4] == ["its share for party 0 is not an (x, y) pair in the field"]


@pytest.mark.parametrize(("n", "k", "t"), [(5, 0, 3), (6, 2, 2), (8, 4, 3)])
def test_a_party_that_names_all_its_neighbours_is_dropped_itself_and_the_round_goes_on(n, k, t, caplog):
    """Party 0's shares all opened, yet it names every neighbour for bad shares (it may: they are in its
    inbox). Dropping them would empty the round (complete graph) or split it (SecAgg+); a party that
    names several is the suspect instead: it is dropped, its accusations ignored, and the round gives
    the sum of everyone else, within the fixed-point bound."""
    r = Round(n, SecAggParams(threshold=t, neighbours=k, min_group=3))
    masked = r.masked()
    accused = {u: r.parties[u].accused for u in masked} | {0: sorted(r.server.graph.neighbours[0])}
    r.server.collect_masked(masked, accused)
    survivors, dropped = r.server.unmask_request()
    assert survivors == list(range(1, n)) and dropped == [0]
    answers = {u: r.parties[u].unmask(survivors, dropped) for u in survivors}
    assert_within_bound(r, r.server.decode(r.server.unmask(answers)))  # the survivors' clipped sum
    assert "party 0 names" in caplog.text and "it is dropped itself, its accusations ignored" in caplog.text
