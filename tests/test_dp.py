"""DP-FedAvg's arithmetic (flat clipping, Gaussian noise and its shares) and its privacy accountant."""

from __future__ import annotations

import json
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedml_moon.privacy.accountant import ORDERS, PrivacyAccountant
from fedml_moon.privacy.dp import clip_to_norm, gaussian_noise, noise_std

DRAWS = 200_000


def test_clip_scales_a_long_vector_to_the_norm():
    clipped, norm = clip_to_norm(torch.tensor([3.0, 4.0], dtype=torch.float64), 1.0)
    assert norm == 5.0
    assert torch.allclose(clipped, torch.tensor([0.6, 0.8], dtype=torch.float64), rtol=0, atol=1e-15)


def test_clip_leaves_a_short_vector_unchanged():
    vector = torch.tensor([0.3, 0.4], dtype=torch.float64)
    clipped, norm = clip_to_norm(vector, 1.0)
    assert norm == pytest.approx(0.5, abs=1e-15)
    assert torch.equal(clipped, vector)


def test_clip_keeps_a_zero_vector_zero():
    clipped, norm = clip_to_norm(torch.zeros(7), 1.0)
    assert norm == 0.0
    assert torch.equal(clipped, torch.zeros(7))


def test_clip_returns_the_input_dtype_and_never_exceeds_the_norm():
    clipped, norm = clip_to_norm(torch.tensor([3.0, 4.0], dtype=torch.float32), 1.0)
    assert clipped.dtype == torch.float32 and norm == 5.0
    assert torch.allclose(clipped, torch.tensor([0.6, 0.8]), atol=1e-7)
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for scale in (1e-2, 1.0, 10.0):  # entries stay within float16's range
            vector = (torch.randn(4, 1000, generator=generator) * scale * 100).to(dtype)
            clip = 0.37 * scale
            clipped, _ = clip_to_norm(vector, clip)
            assert clipped.shape == vector.shape and clipped.dtype == dtype
            assert float(torch.linalg.vector_norm(clipped.to(torch.float64))) <= clip


def test_clip_refuses_non_finite_vectors_and_bad_norms():
    with pytest.raises(ValueError, match="non-finite"):
        clip_to_norm(torch.tensor([1.0, float("nan")]), 1.0)
    for clip in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="clipping norm"):
            clip_to_norm(torch.ones(3), clip)


def test_noise_has_the_asked_std_and_zero_mean():
    # Sample std's standard error is std / sqrt(2 (n - 1)), the mean's std / sqrt(n): 4 of each allowed.
    std = 0.5
    draws = gaussian_noise(torch.zeros(DRAWS), std, torch.Generator().manual_seed(1)).to(torch.float64)
    assert draws.shape == (DRAWS,) and draws.dtype == torch.float64
    assert abs(float(draws.std()) - std) <= 4 * std / math.sqrt(2 * (DRAWS - 1))
    assert abs(float(draws.mean())) <= 4 * std / math.sqrt(DRAWS)


def test_noise_without_a_generator_is_fresh_and_with_one_repeats():
    zeros = torch.zeros(64, dtype=torch.float64)
    torch.manual_seed(0)
    first = gaussian_noise(zeros, 1.0)
    torch.manual_seed(0)
    assert not torch.equal(first, gaussian_noise(zeros, 1.0))
    again = [gaussian_noise(zeros, 1.0, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(again[0], again[1])
    assert gaussian_noise(torch.zeros(3, 2, dtype=torch.float16), 1.0).dtype == torch.float16


def test_noise_shares_sum_to_sigma_times_clip():
    # 9 shares of std 1 sum to std sigma * C = 3; 4 standard errors of the sample std allowed.
    assert noise_std(2.0, 1.5, 9) == 1.0
    assert noise_std(2.0, 1.5) == 3.0
    generator = torch.Generator().manual_seed(2)
    total = sum(
        gaussian_noise(torch.zeros(DRAWS, dtype=torch.float64), noise_std(2.0, 1.5, 9), generator)
        for _ in range(9)
    )
    assert abs(float(total.std()) - 3.0) <= 4 * 3.0 / math.sqrt(2 * (DRAWS - 1))
    with pytest.raises(ValueError, match="shares"):
        noise_std(1.0, 1.0, 0)


def test_epsilon_matches_the_rdp_libraries_own_gaussian_example():
    # dp_accounting/rdp/rdp_privacy_accountant_test.py, test_compute_epsilon_delta_gaussian: "noise
    # multiplier is chosen to obtain exactly (1,1e-6)-DP": a Gaussian of multiplier 4.530877117, asserted
    # to 7 places over orders 1.000..99.999 by 0.001. Sampling every party (q = 1) one round is that
    # Gaussian; under REPLACE_ONE the sum moves by 2C, so sigma = 2 x 4.530877117. The default order grid
    # lands within 3e-7 of 1, so 1e-6 here.
    accountant = PrivacyAccountant(2 * 4.530877117, population=20, sample_size=20, delta=1e-6)
    assert accountant.step() == pytest.approx(1.0, abs=1e-6)


def test_epsilon_matches_the_pld_libraries_own_gaussian_example():
    # dp_accounting/pld/pld_privacy_accountant_test.py, test_gaussian_basic: GaussianDpEvent(sqrt(3))
    # composed 3 times (add/remove) is exactly (1, 0.126936)-DP, asserted to 1e-3. Under REPLACE_ONE the
    # same PLD comes from sigma = 2 sqrt(3); every party sampled, 3 rounds.
    accountant = PrivacyAccountant(
        2 * math.sqrt(3), population=8, sample_size=8, delta=0.126936, accountant="pld"
    )
    assert accountant.step(3) == pytest.approx(1.0, abs=1e-3)
    # The RDP bound of the same rounds can only be looser than the tight PLD figure (1.504: RDP's
    # conversion to (epsilon, delta) is loose at so large a delta); a shift of C, not 2C, would give less.
    rdp = PrivacyAccountant(2 * math.sqrt(3), population=8, sample_size=8, delta=0.126936)
    assert 1.0 - 1e-3 <= rdp.epsilon_after(3) <= 1.6


def test_epsilon_is_what_the_library_gives_for_the_rounds_event():
    accountant = PrivacyAccountant(1.1, population=100, sample_size=10, delta=1e-5)
    event = accountant.event()
    assert isinstance(event, dp_event.SampledWithoutReplacementDpEvent)
    assert (event.source_dataset_size, event.sample_size) == (100, 10)
    library = rdp_privacy_accountant.RdpAccountant(list(ORDERS), NeighboringRelation.REPLACE_ONE)
    library.compose(event, 40)
    assert accountant.epsilon_after(40) == pytest.approx(library.get_epsilon(1e-5), rel=1e-12)


def test_epsilon_grows_with_rounds_and_falls_as_sigma_grows():
    accountant = PrivacyAccountant(1.0, population=100, sample_size=10, delta=1e-5)
    assert accountant.epsilon() == 0.0 and accountant.rounds == 0
    epsilons = [accountant.step() for _ in range(3)] + [accountant.step(7)]
    assert accountant.rounds == 10
    assert all(a < b for a, b in zip(epsilons, epsilons[1:], strict=False))
    assert accountant.epsilon() == epsilons[-1] == accountant.epsilon_after(10)
    by_sigma = [PrivacyAccountant(s, 100, 10, 1e-5).epsilon_after(10) for s in (0.8, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:], strict=False))


def test_rounds_within_agrees_with_epsilon_after():
    accountant = PrivacyAccountant(1.0, population=100, sample_size=10, delta=1e-5)
    for target in (0.5, 2.0, 8.0):
        rounds = accountant.rounds_within(target, limit=5000)
        assert accountant.epsilon_after(rounds) <= target < accountant.epsilon_after(rounds + 1)
    assert accountant.rounds_within(1e9, limit=30) == 30
    assert accountant.rounds_within(0.0, limit=30) == 0


def test_state_round_trips_through_json_and_refuses_other_settings():
    accountant = PrivacyAccountant(1.3, population=50, sample_size=5, delta=1e-5)
    accountant.step(12)
    state = json.loads(json.dumps(accountant.state()))
    assert state == {
        "rounds": 12,
        "noise_multiplier": 1.3,
        "population": 50,
        "sample_size": 5,
        "delta": 1e-5,
        "accountant": "rdp",
    }
    restored = PrivacyAccountant(1.3, population=50, sample_size=5, delta=1e-5)
    restored.load_state(state)
    assert restored.rounds == 12 and restored.epsilon() == accountant.epsilon()
    with pytest.raises(ValueError, match="noise_multiplier 1.3"):
        PrivacyAccountant(1.4, population=50, sample_size=5, delta=1e-5).load_state(state)
    with pytest.raises(ValueError, match="rounds"):
        restored.load_state({**state, "rounds": -1})


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ((0.0, 10, 5, 1e-5), "dp_noise_multiplier"),
        ((-1.0, 10, 5, 1e-5), "dp_noise_multiplier"),
        ((1.0, 10, 5, 0.0), "dp_delta"),
        ((1.0, 10, 5, 1.0), "dp_delta"),
        ((1.0, 10, 5, -1e-5), "dp_delta"),
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
    assert pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE).supports(
        PrivacyAccountant(1.0, 10, 10, 1e-5, accountant="pld").event()
    )
