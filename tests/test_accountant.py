"""The privacy accountant, checked against Google's dp-accounting library for every epsilon it reports:
against the server (which knows each round's sample: each party's own rounds composed, no sampling
gain) and for the release (an observer who does not know the sample: the smaller of every round
composed with sampling and the server's figure), with dropouts and with rounds of other noise."""

from __future__ import annotations

import json
import math
import random

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedml_moon.core.schedule import sample_schedule
from fedml_moon.privacy.accountant import ORDERS, PrivacyAccountant, _replace_one_factor

ADD_REMOVE, REPLACE = NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_ONE


def library_server(history: list[tuple[float, list[int]]], delta: float) -> float:
    """dp-accounting's own figure against the server: per party, a Gaussian of a shift of 2C (its
    multiplier sigma / 2 against a shift of C) for each round its contribution is in; the largest."""
    worst = 0.0
    for party in {p for _, ids in history for p in ids}:
        accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS), ADD_REMOVE)
        for sigma, ids in history:
            if party in ids:
                accountant.compose(dp_event.GaussianDpEvent(sigma / 2))
        worst = max(worst, accountant.get_epsilon(delta))
    return worst


def library_release(history: list[tuple[float, list[int]]], n: int, m: int, delta: float) -> float:
    """dp-accounting's figure of every round sampled without replacement (REPLACE_ONE), the smaller of
    it and the server's."""
    accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS), REPLACE)
    for sigma, _ in history:
        gaussian = dp_event.GaussianDpEvent(sigma * _replace_one_factor())
        accountant.compose(dp_event.SampledWithoutReplacementDpEvent(n, m, gaussian))
    return min(accountant.get_epsilon(delta), library_server(history, delta))


def test_the_library_still_reads_a_replace_one_gaussian_against_a_shift_of_c():
    """google/differential-privacy issue #378: while it does, the sampled event gets sigma / 2."""
    assert _replace_one_factor() == 0.5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_epsilons_are_the_librarys_with_dropouts_and_other_noise(seed):
    """100 parties, 20 sampled a round, 30 rounds; in some rounds only half of the sampled are in the
    sum (dropouts), and the noise multiplier varies as under secure aggregation (more reporters than
    the quorum: more noise)."""
    rng = random.Random(seed)
    accountant = PrivacyAccountant(1.0, population=100, sample_size=20, delta=1e-5)
    history = []
    for ids in sample_schedule(100, 20, 30, seed):
        kept = ids if rng.random() < 0.5 else rng.sample(ids, 10)
        sigma = rng.choice([1.0, 1.0, math.sqrt(2)])
        accountant.record(kept, sigma)
        history.append((sigma, kept))
    assert accountant.epsilon_server() == pytest.approx(library_server(history, 1e-5), rel=1e-9)
    assert accountant.epsilon_release() == pytest.approx(library_release(history, 100, 20, 1e-5), rel=1e-9)
    assert accountant.epsilon_release() <= accountant.epsilon_server()


def test_the_rdp_libraries_own_gaussian_example():
    # dp_accounting/rdp/rdp_privacy_accountant_test.py: a Gaussian of multiplier 4.530877117 is exactly
    # (1, 1e-6)-DP. One round with every party in the sum is that Gaussian of a shift of 2C when
    # sigma = 2 x 4.530877117; nothing is sampled, so both epsilons are it. The order grid lands within 3e-7.
    accountant = PrivacyAccountant(2 * 4.530877117, population=20, sample_size=20, delta=1e-6)
    accountant.record(range(20))
    assert accountant.epsilon_server() == pytest.approx(1.0, abs=1e-6)
    assert accountant.epsilon_release() == pytest.approx(1.0, abs=1e-6)


def test_the_pld_libraries_own_gaussian_example():
    # dp_accounting/pld/pld_privacy_accountant_test.py: GaussianDpEvent(sqrt(3)) composed 3 times
    # (add/remove) is (1, 0.126936)-DP. Under REPLACE_ONE the same PLD comes from sigma = 2 sqrt(3).
    accountant = PrivacyAccountant(
        2 * math.sqrt(3), population=8, sample_size=8, delta=0.126936, accountant="pld"
    )
    for _ in range(3):
        accountant.record(range(8))
    assert accountant.epsilon_server() == pytest.approx(1.0, abs=1e-3)
    assert accountant.epsilon_release() == accountant.epsilon_server()  # every party every round: no gain
    assert pld_privacy_accountant.PLDAccountant(REPLACE).supports(dp_event.GaussianDpEvent(1.0))


def test_the_release_epsilon_is_never_above_the_bound_without_sampling():
    """4 parties, 2 sampled, sigma 0.2: after one round the sampled bound (about 109) exceeds the one
    without sampling (about 96); the release's figure is the smaller."""
    accountant = PrivacyAccountant(0.2, population=4, sample_size=2, delta=1e-5)
    accountant.record([0, 1])
    sampled = rdp_privacy_accountant.RdpAccountant(list(ORDERS), REPLACE)
    event = dp_event.GaussianDpEvent(0.2 * _replace_one_factor())
    sampled.compose(dp_event.SampledWithoutReplacementDpEvent(4, 2, event))
    assert sampled.get_epsilon(1e-5) > accountant.epsilon_server() > 50
    assert accountant.epsilon_release() == accountant.epsilon_server()


def test_against_the_server_sampling_buys_nothing():
    """sigma 2, 200 parties, 20 sampled a round, 500 rounds: the release's figure gains from sampling
    (about 36.6); against the server, which knows the sample, a party loses privacy in every round it
    was sampled, so its figure is the most-sampled party's rounds composed."""
    schedule = sample_schedule(200, 20, 500, 0)
    accountant = PrivacyAccountant(2.0, population=200, sample_size=20, delta=1e-5)
    for ids in schedule:
        accountant.record(ids)
    most = max(sum(p in ids for ids in schedule) for p in range(200))
    alone = rdp_privacy_accountant.RdpAccountant(list(ORDERS), ADD_REMOVE)
    alone.compose(dp_event.GaussianDpEvent(1.0), most)
    assert accountant.epsilon_server() == pytest.approx(alone.get_epsilon(1e-5), rel=1e-9)
    assert accountant.epsilon_release() == pytest.approx(36.6, abs=0.1)
    assert accountant.epsilon_server() == pytest.approx(71.8, abs=0.1)  # the most-sampled party: 68 rounds
    assert most == 68


def test_rounds_within_stops_before_the_round_that_passes_the_target():
    schedule = sample_schedule(50, 10, 200, 1)
    for server, target, expected in ((True, 4.0, 1), (True, 10.0, 23), (False, 4.0, 7), (False, 10.0, 36)):
        rounds = PrivacyAccountant(3.0, 50, 10, 1e-5).rounds_within(target, schedule, server)
        assert rounds == expected
        for count, within in ((rounds, True), (rounds + 1, False)):
            accountant = PrivacyAccountant(3.0, 50, 10, 1e-5)
            for ids in schedule[:count]:
                accountant.record(ids)
            figure = accountant.epsilon_server() if server else accountant.epsilon_release()
            assert (figure <= target) == within, (server, target, count, figure)
    assert PrivacyAccountant(3.0, 50, 10, 1e-5).rounds_within(1e9, schedule[:30], True) == 30


def test_state_round_trips_through_json_and_refuses_other_settings():
    accountant = PrivacyAccountant(1.3, population=50, sample_size=5, delta=1e-5)
    for ids in sample_schedule(50, 5, 12, 3):
        accountant.record(ids[:4], 1.4)
    state = json.loads(json.dumps(accountant.state()))
    restored = PrivacyAccountant(1.3, population=50, sample_size=5, delta=1e-5)
    restored.load_state(state)
    assert restored.rounds == 12 and restored.history == accountant.history
    assert restored.epsilon_server() == accountant.epsilon_server()
    assert restored.epsilon_release() == accountant.epsilon_release()
    with pytest.raises(ValueError, match="noise_multiplier 1.3"):
        PrivacyAccountant(1.4, population=50, sample_size=5, delta=1e-5).load_state(state)
    with pytest.raises(ValueError, match="noise multiplier must be a finite number"):
        restored.load_state({**state, "history": [[-1.0, [0]]]})


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ((0.0, 10, 5, 1e-5), "dp_noise_multiplier"),
        ((-1.0, 10, 5, 1e-5), "dp_noise_multiplier"),
        ((1.0, 10, 5, 0.0), "dp_delta"),
        ((1.0, 10, 5, 1.0), "dp_delta"),
        ((1.0, 10, 11, 1e-5), "client_num_per_round"),
        ((1.0, 10, 0, 1e-5), "client_num_per_round"),
    ],
)
def test_bad_settings_name_their_key(args, key):
    with pytest.raises(ValueError, match=key):
        PrivacyAccountant(*args)


def test_pld_needs_every_party_and_accountants_are_named():
    with pytest.raises(ValueError, match="dp_accountant 'pld'.*client_num_per_round"):
        PrivacyAccountant(1.0, population=10, sample_size=5, delta=1e-5, accountant="pld")
    with pytest.raises(ValueError, match="dp_accountant must be one of rdp, pld"):
        PrivacyAccountant(1.0, population=10, sample_size=5, delta=1e-5, accountant="moments")
