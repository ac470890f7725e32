"""SecAgg (Bonawitz et al., CCS 2017, Fig. 4) and SecAgg+ (Bell et al., CCS 2020) as their papers claim
them, parties and server run in process: the server gets the survivors' sum and nothing else, dropouts
are survived while t shares come back, and what is tampered with, replayed or malformed is refused or
stepped around (a sender whose shares do not open is named and dropped; a wrong unmasking share is
outvoted where more than t came back)."""

from __future__ import annotations

import pytest
import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.privacy.secagg import SecAggError, SecAggParams, pack, unpack
from tests.support.secagg import LENGTH, Round, assert_within_bound


@pytest.mark.parametrize(
    ("n", "k", "t", "encoding"),
    [
        (5, 0, 3, FixedPoint()),  # SecAgg: the complete graph
        (8, 2, 2, FixedPoint()),  # SecAgg+: two neighbours each
        (8, 2, 2, FixedPoint(clip=8.0, bits=22, k=40)),  # 64-bit words
        (6, 0, 4, FixedPoint(clip=8.0, bits=12, k=20)),  # k < 32
    ],
)
def test_the_server_gets_the_sum_within_the_fixed_point_bound(n, k, t, encoding):
    r = Round(n, SecAggParams(threshold=t, neighbours=k, encoding=encoding))
    shares = r.share()
    assert all(len(out) == (k or n - 1) for out in shares.values())  # SecAgg+: only the k neighbours
    inboxes = r.server.route(shares)
    masked = {u: r.parties[u].mask(r.inputs[u], inbox) for u, inbox in inboxes.items()}
    assert r.server.collect_masked(masked) == (list(range(n)), [])
    survivors, dropped = r.server.unmask_request()
    decoded = r.server.decode(r.server.unmask({u: r.parties[u].unmask(survivors, dropped) for u in range(n)}))
    assert_within_bound(r, decoded)


@pytest.mark.parametrize(("n", "k", "t"), [(5, 0, 3), (10, 4, 3)])
def test_dropouts_after_sharing_and_after_masking_leave_exactly_the_survivors_sum(n, k, t):
    """Party 2 shared its keys, then dropped before masking: its pairwise masks are removed through its
    rebuilt s-seed. Party 4 sent its masked input, then never answered: its b_u is rebuilt from its
    neighbours' shares, so its input stays in the sum."""
    r = Round(n, SecAggParams(threshold=t, neighbours=k))
    decoded = r.run(skip_mask=(2,), silent=(4,))
    assert r.server.survivors == [u for u in range(n) if u != 2] and r.server.dropped == [2]
    assert_within_bound(r, decoded)


def test_a_party_that_never_shared_is_out_and_the_rest_sum():
    r = Round(6, SecAggParams(threshold=4))
    decoded = r.run(skip_share=(5,), skip_mask=(1,))
    assert r.server.survivors == [0, 2, 3, 4] and r.server.dropped == [1]
    assert_within_bound(r, decoded)


def test_fewer_than_t_answers_give_no_sum():
    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(silent=(2, 3, 4))
    with pytest.raises(SecAggError, match=r"only 2 shares of party 0's b-seed .* threshold t=3"):
        r.server.unmask(responses)


def test_a_party_refuses_to_unmask_with_fewer_than_t_survivors_around_it():
    """SecAgg+ with 10 parties, 4 neighbours (t = 3 of 5): a request that keeps a connected crowd of
    survivors but only 2 of party 0's neighbourhood is refused, and the refusal uses up nothing."""
    r = Round(10, SecAggParams(threshold=3, neighbours=4))
    r.server.collect_masked(r.masked())
    graph, party = r.server.graph, 0
    around = graph.members(party)
    gone = [v for v in around if v != party][1:]  # keep party 0 and one neighbour
    alive = [u for u in range(10) if u not in gone]
    assert len(graph.components(alive)) == 1
    with pytest.raises(SecAggError, match=r"party 0: only 2 of its neighbourhood \+ itself survive.*t=3"):
        r.parties[party].unmask(alive, gone)
    assert r.parties[party].unmask(list(range(10)), [])  # refusing revealed nothing, used up no call


def _p_uniform_top_bits(values: torch.Tensor, k: int, bits: int = 8) -> float:
    """Chi-square test of the top `bits` bits of values in [0, 2^k) against uniform: the p-value."""
    counts = torch.bincount(values >> (k - bits), minlength=2**bits).double()
    expected = values.numel() / 2**bits
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    df = torch.tensor((2**bits - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(chi2 / 2, dtype=torch.float64)))


@pytest.mark.parametrize("value", [0.0, 1.5])
def test_a_masked_vector_is_indistinguishable_from_uniform(value):
    """What the server holds of one party, y_u for an all-zero or constant input of 20,000 values, passes
    a chi-square test of uniformity over its top 8 bits (p > 1e-3); the unmasked encoding fails it."""
    r = Round(3, SecAggParams(threshold=2), length=20_000)
    r.inputs[0] = torch.full((20_000,), value, dtype=torch.float64)
    y = r.masked()[0]
    k = r.params.encoding.k
    assert y.dtype == torch.int64 and int(y.min()) >= 0 and int(y.max()) < 2**k
    assert _p_uniform_top_bits(y, k) > 1e-3
    assert _p_uniform_top_bits(r.params.encoding.encode(r.inputs[0]), k) < 1e-3


def _inboxes(r: Round) -> dict[int, dict[int, bytes]]:
    return r.server.route(r.share())


def _flip(blob: bytes) -> bytes:
    out = bytearray(blob)
    out[20] ^= 0x01
    return bytes(out)


def test_a_tampered_ciphertext_is_left_out_and_its_sender_named():
    r = Round(3, SecAggParams(threshold=2))
    inbox = _inboxes(r)[1]
    r.parties[1].mask(r.inputs[1], {0: _flip(inbox[0]), 2: inbox[2]})
    assert r.parties[1].accused == [0]


def test_a_ciphertext_replayed_from_the_previous_round_is_left_out_and_its_sender_named():
    before, now = (
        Round(3, SecAggParams(threshold=2), round_idx=0),
        Round(3, SecAggParams(threshold=2), round_idx=1),
    )
    old, inbox = _inboxes(before)[1], _inboxes(now)[1]
    now.parties[1].mask(now.inputs[1], {0: old[0], 2: inbox[2]})
    assert now.parties[1].accused == [0]


def test_a_ciphertext_relabelled_to_another_sender_is_left_out_naming_that_sender():
    r = Round(3, SecAggParams(threshold=2))
    inbox = _inboxes(r)[1]
    r.parties[1].mask(r.inputs[1], {0: inbox[0], 2: inbox[0]})
    assert r.parties[1].accused == [2]


def test_a_party_left_with_fewer_than_t_good_senders_cannot_take_part():
    r = Round(5, SecAggParams(threshold=3))
    inbox = _inboxes(r)[1]
    bad = {v: _flip(ct) for v, ct in inbox.items()}
    bad[0] = inbox[0]
    with pytest.raises(SecAggError, match=r"party 1: only 1 neighbours' shares opened \(\[0\]\).*t=3"):
        r.parties[1].mask(r.inputs[1], bad)


def test_stray_shares_from_a_party_not_in_the_graph_neighbourhood_are_refused():
    r = Round(10, SecAggParams(threshold=2, neighbours=2))
    inboxes = _inboxes(r)
    stranger = next(v for v in range(10) if v != 0 and v not in r.server.graph.neighbours[0])
    sender = next(iter(inboxes[0]))
    with pytest.raises(SecAggError, match=rf"party 0: got shares from parties \[{stranger}\], not among"):
        r.parties[0].mask(r.inputs[0], {**inboxes[0], stranger: inboxes[0][sender]})


def test_bad_parameters_keys_vectors_and_requests_are_refused_clearly():
    with pytest.raises(ValueError, match=r"threshold \(t\) must be an integer >= 1; got 0"):
        SecAggParams(threshold=0)
    with pytest.raises(ValueError, match=r"neighbours \(SecAgg\+ degree k\) must be an integer >= 0"):
        SecAggParams(threshold=2, neighbours=-1)
    with pytest.raises(ValueError, match=r"min_group must be an integer >= 2 .* got 1"):
        SecAggParams(threshold=2, min_group=1)

    r = Round(3, SecAggParams(threshold=2))
    keys = {u: p.advertise() for u, p in r.parties.items()}
    keys[2] = {**keys[2], "s_pk": keys[2]["s_pk"][:31]}
    with pytest.raises(SecAggError, match="party 2's s_pk must be 32 bytes; got 31 bytes"):
        r.parties[0].share(keys, {})
    with pytest.raises(SecAggError, match="party 2's s_pk must be 32 bytes; got 31 bytes"):
        r.server.collect_keys(keys)
    keys[2] = {**keys[2], "s_pk": bytes(32)}  # the all-zero u-coordinate: a low-order point
    with pytest.raises(SecAggError, match="party 2's s_pk is a low-order X25519 point"):
        r.server.collect_keys(keys)

    r = Round(3, SecAggParams(threshold=2))
    masked = r.masked()
    with pytest.raises(SecAggError, match=f"party 1's masked vector has {LENGTH - 1} values, not {LENGTH}"):
        r.server.collect_masked({**masked, 1: masked[1][1:]})
    with pytest.raises(SecAggError, match="must be a 1-D int64 tensor"):
        r.server.collect_masked({**masked, 1: pack(masked[1], 32)})
    with pytest.raises(SecAggError, match=r"party 1 names parties \[0\] for bad shares, but it sent no"):
        r.server.collect_masked({0: masked[0], 2: masked[2]}, {1: [0]})

    r = Round(4, SecAggParams(threshold=3))
    r.masked()
    with pytest.raises(SecAggError, match=r"parties \[1\] are both survivors and dropped"):
        r.parties[0].unmask([0, 1, 2, 3], [1])
    with pytest.raises(SecAggError, match=r"parties \[7\] are not participants of the round"):
        r.parties[0].unmask([0, 1, 2, 3, 7], [])
    with pytest.raises(SecAggError, match=r"does not say whether parties \[3\] survived"):
        r.parties[0].unmask([0, 1, 2], [])
    r.parties[0].unmask([0, 1, 2, 3], [])
    with pytest.raises(SecAggError, match="already answered this round"):
        r.parties[0].unmask([0, 1, 2, 3], [])

    # listed as dropped after its masked input (a neighbour named it): its own s-seed share only, never
    # a b share; and still once, and never for lists it cannot accept
    r = Round(4, SecAggParams(threshold=3))
    r.masked()
    with pytest.raises(SecAggError, match=r"parties \[7\] are not participants of the round"):
        r.parties[1].unmask([0, 2, 3, 7], [1])
    with pytest.raises(SecAggError, match=r"parties \[1\] are both survivors and dropped"):
        r.parties[1].unmask([0, 1, 2, 3], [1])
    answer = r.parties[0].unmask([1, 2, 3], [0])
    assert answer["b"] == {} and list(answer["s"]) == [0]
    with pytest.raises(SecAggError, match="already answered this round"):
        r.parties[0].unmask([0, 1, 2, 3], [])


def test_too_small_rounds_and_misaddressed_shares_are_refused():
    with pytest.raises(SecAggError, match="2 participants, fewer than 3"):
        Round(2, SecAggParams(threshold=2)).keys()
    with pytest.raises(SecAggError, match=r"t=4 exceeds the neighbourhood of 3 .*raise secagg_neighbours"):
        Round(8, SecAggParams(threshold=4, neighbours=2)).keys()
    r = Round(8, SecAggParams(threshold=2, neighbours=2))
    shares = r.share()
    near = sorted(r.server.graph.neighbours[0])
    far = next(v for v in range(1, 8) if v not in near)
    shares[0] = {**shares[0], far: shares[0][near[0]]}
    with pytest.raises(
        SecAggError,
        match=rf"party 0 addressed shares to \[.*\], but its neighbours are \[{near[0]}, {near[1]}\]",
    ):
        r.server.route(shares)


@pytest.mark.parametrize("k", [32, 40])
def test_pack_and_unpack_round_trip(k):
    values = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**k - 1, 12345], dtype=torch.int64) % 2**k
    wire = pack(values, k)
    assert wire.dtype == (torch.int32 if k <= 32 else torch.int64)
    assert torch.equal(unpack(wire, k), values)
    with pytest.raises(SecAggError, match="takes a torch.int(32|64) tensor"):
        unpack(wire.to(torch.int16), k)
