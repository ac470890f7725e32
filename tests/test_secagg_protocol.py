"""SecAgg (Bonawitz et al., CCS 2017, Fig. 4) and SecAgg+ (Bell et al., CCS 2020) as their papers claim
them, parties and server run in process: the server gets the survivors' sum and nothing else, dropouts
are survived while t shares come back, and what is tampered with, replayed or malformed is refused."""

from __future__ import annotations

import pytest
import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.privacy.secagg import (
    PartySession,
    SecAggError,
    SecAggParams,
    ServerSession,
    neighbourhood,
    pack,
    unpack,
)

LENGTH = 1000


class Round:
    """A small driver: n parties and the server of one round, stepped through the four rounds."""

    def __init__(self, n: int, params: SecAggParams, length: int = LENGTH, round_idx: int = 0) -> None:
        self.params, self.length = params, length
        self.parties = {u: PartySession(u, round_idx, params) for u in range(n)}
        self.server = ServerSession(round_idx, params, length)
        g = torch.Generator().manual_seed(round_idx)
        self.inputs = {u: torch.randn(length, generator=g, dtype=torch.float64) * 3 for u in range(n)}

    def keys(self) -> dict[int, dict]:
        return self.server.collect_keys({u: p.advertise() for u, p in self.parties.items()})

    def share(self, skip=()) -> dict[int, dict[int, bytes]]:
        rosters = self.keys()
        return {u: p.share(rosters[u]) for u, p in self.parties.items() if u not in skip}

    def masked(self, skip_share=(), skip_mask=()) -> dict[int, torch.Tensor]:
        inboxes = self.server.route(self.share(skip_share))
        return {
            u: self.parties[u].mask(self.inputs[u], inbox)
            for u, inbox in inboxes.items()
            if u not in skip_mask
        }

    def responses(self, skip_share=(), skip_mask=(), silent=()) -> dict[int, dict]:
        survivors, _ = self.server.collect_masked(self.masked(skip_share, skip_mask))
        asks = self.server.unmask_requests()
        return {u: self.parties[u].unmask(*asks[u]) for u in survivors if u not in silent}

    def run(self, skip_share=(), skip_mask=(), silent=()) -> torch.Tensor:
        total = self.server.unmask(self.responses(skip_share, skip_mask, silent))
        return self.server.decode(total)

    def exact(self) -> torch.Tensor:
        enc = self.params.encoding
        return sum(self.inputs[u].clamp(-enc.clip, enc.clip) for u in self.server.survivors)


def _assert_within_bound(r: Round, decoded: torch.Tensor) -> None:
    """The decoded sum is the sum of the clipped inputs to within n / (2 scale) per element."""
    n, enc = len(r.server.survivors), r.params.encoding
    assert decoded.dtype == torch.float64
    assert enc.error_bound(n) == n / (2 * 2**enc.bits / (2 * enc.clip))
    assert float((decoded - r.exact()).abs().max()) <= enc.error_bound(n)


def test_the_circulant_graph_is_symmetric_with_k_rounded_up_to_even():
    ids = [3, 10, 11, 20, 42, 50, 51, 60]
    assert neighbourhood(ids, 3, 2) == [10, 60]
    assert neighbourhood(ids, 3, 3) == neighbourhood(ids, 3, 4) == [10, 11, 51, 60]
    assert neighbourhood(ids, 20, 0) == neighbourhood(ids, 20, 7) == [3, 10, 11, 42, 50, 51, 60]
    for u in ids:
        assert all(u in neighbourhood(ids, v, 4) for v in neighbourhood(ids, u, 4))
    with pytest.raises(SecAggError, match="party 5 is not among the participants"):
        neighbourhood(ids, 5, 2)


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
    asks = r.server.unmask_requests()
    decoded = r.server.decode(r.server.unmask({u: r.parties[u].unmask(*asks[u]) for u in range(n)}))
    _assert_within_bound(r, decoded)


@pytest.mark.parametrize(("n", "k", "t"), [(5, 0, 3), (10, 4, 3)])
def test_dropouts_after_sharing_and_after_masking_leave_exactly_the_survivors_sum(n, k, t):
    """Party 2 shared its keys, then dropped before masking: its pairwise masks are removed through its
    rebuilt s-seed. Party 4 sent its masked input, then never answered: its b_u is rebuilt from its
    neighbours' shares, so its input stays in the sum."""
    r = Round(n, SecAggParams(threshold=t, neighbours=k))
    decoded = r.run(skip_mask=(2,), silent=(4,))
    assert r.server.survivors == [u for u in range(n) if u != 2] and r.server.dropped == [2]
    _assert_within_bound(r, decoded)


def test_a_party_that_never_shared_is_out_and_the_rest_sum():
    r = Round(6, SecAggParams(threshold=3))
    decoded = r.run(skip_share=(5,), skip_mask=(1,))
    assert r.server.survivors == [0, 2, 3, 4] and r.server.dropped == [1]
    _assert_within_bound(r, decoded)


def test_fewer_than_t_answers_give_no_sum():
    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(silent=(2, 3, 4))
    with pytest.raises(SecAggError, match=r"only 2 shares of party 0's b-seed .* threshold t=3"):
        r.server.unmask(responses)


def test_a_party_refuses_to_unmask_with_fewer_than_t_survivors_around_it():
    r = Round(5, SecAggParams(threshold=3))
    r.server.collect_masked(r.masked())
    with pytest.raises(SecAggError, match=r"party 0: only 2 of its neighbourhood \+ itself survive.*t=3"):
        r.parties[0].unmask([0, 1], [2, 3, 4])
    assert r.parties[0].unmask([0, 1, 2], [3, 4])  # refusing revealed nothing and did not use up the call


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


def test_a_tampered_ciphertext_is_refused_naming_its_sender():
    r = Round(3, SecAggParams(threshold=2))
    inbox = _inboxes(r)[1]
    blob = bytearray(inbox[0])
    blob[20] ^= 0x01
    with pytest.raises(SecAggError, match="party 1: the shares from party 0 do not decrypt"):
        r.parties[1].mask(r.inputs[1], {0: bytes(blob), 2: inbox[2]})


def test_a_ciphertext_replayed_from_the_previous_round_is_refused_naming_its_sender():
    before, now = (
        Round(3, SecAggParams(threshold=2), round_idx=0),
        Round(3, SecAggParams(threshold=2), round_idx=1),
    )
    old, inbox = _inboxes(before)[1], _inboxes(now)[1]
    with pytest.raises(SecAggError, match="round 1, .*the shares from party 0 do not decrypt"):
        now.parties[1].mask(now.inputs[1], {0: old[0], 2: inbox[2]})


def test_a_ciphertext_relabelled_to_another_sender_is_refused_naming_that_sender():
    r = Round(3, SecAggParams(threshold=2))
    inbox = _inboxes(r)[1]
    with pytest.raises(SecAggError, match="the shares from party 2 do not decrypt"):
        r.parties[1].mask(r.inputs[1], {0: inbox[0], 2: inbox[0]})


def test_a_tampered_unmask_share_is_refused_naming_who_sent_it():
    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(skip_mask=(4,))
    x, y = responses[2]["b"][0]
    responses[2]["b"][0] = (x, y + 1)
    with pytest.raises(SecAggError, match=r"party 0's b-seed .* \(b_commit\): the share from parties \[2\]"):
        r.server.unmask(responses)

    r = Round(5, SecAggParams(threshold=3))
    responses = r.responses(skip_mask=(4,))
    x, y = responses[1]["s"][4]
    responses[1]["s"][4] = (x, y + 1)
    with pytest.raises(SecAggError, match=r"party 4's s-seed .* \(s_pk\): the share from parties \[1\]"):
        r.server.unmask(responses)


def test_bad_parameters_keys_vectors_and_requests_are_refused_clearly():
    with pytest.raises(ValueError, match=r"threshold \(t\) must be an integer >= 1; got 0"):
        SecAggParams(threshold=0)
    with pytest.raises(ValueError, match=r"neighbours \(SecAgg\+ degree k\) must be an integer >= 0"):
        SecAggParams(threshold=2, neighbours=-1)

    r = Round(3, SecAggParams(threshold=2))
    keys = {u: p.advertise() for u, p in r.parties.items()}
    keys[2] = {**keys[2], "s_pk": keys[2]["s_pk"][:31]}
    with pytest.raises(SecAggError, match="party 2's s_pk must be 32 bytes; got 31 bytes"):
        r.parties[0].share(keys)
    with pytest.raises(SecAggError, match="party 2's s_pk must be 32 bytes; got 31 bytes"):
        r.server.collect_keys(keys)

    r = Round(3, SecAggParams(threshold=2))
    masked = r.masked()
    with pytest.raises(SecAggError, match=f"party 1's masked vector has {LENGTH - 1} values, not {LENGTH}"):
        r.server.collect_masked({**masked, 1: masked[1][1:]})
    with pytest.raises(SecAggError, match="must be a 1-D int64 tensor"):
        r.server.collect_masked({**masked, 1: pack(masked[1], 32)})
    with pytest.raises(SecAggError, match=r"parties \[1\] are both survivors and dropped"):
        r.parties[0].unmask([0, 1], [1, 2])
    with pytest.raises(SecAggError, match=r"parties \[7\] did not share with this party"):
        r.parties[0].unmask([0, 1, 7], [])
    r.parties[0].unmask([0, 1, 2], [])
    with pytest.raises(SecAggError, match="already answered this round"):
        r.parties[0].unmask([0, 1, 2], [])


def test_too_small_rounds_and_stray_shares_are_refused():
    with pytest.raises(SecAggError, match="only 2 parties advertised keys, fewer than the threshold t=3"):
        Round(2, SecAggParams(threshold=3)).keys()
    with pytest.raises(SecAggError, match=r"neighbourhoods of 3 parties .* t=4: lower t or raise neighbours"):
        Round(8, SecAggParams(threshold=4, neighbours=2)).keys()
    r = Round(8, SecAggParams(threshold=2, neighbours=2))
    shares = r.share()
    shares[0] = {**shares[0], 4: shares[0][1]}
    with pytest.raises(
        SecAggError, match=r"party 0 addressed shares to \[1, 4, 7\], but its neighbours are \[1, 7\]"
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
