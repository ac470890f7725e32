"""The privacy accountant of DP-FedAvg runs (`privacy_args.dp_*`): client-level (epsilon, delta) from
Google's dp-accounting library. A module of its own so that only runs with DP import that library
(about a second of start-up in every process otherwise).

A round draws a fixed number m of the n parties without replacement, so the privacy loss is accounted
under the neighbouring relation that sampling needs: REPLACE_ONE (one party's data replaced by
another's, n public); `fedml_moon.privacy.dp` holds the clipping and the noise.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedml_moon.privacy.options import ACCOUNTANTS

log = logging.getLogger(__name__)
ORDERS = tuple(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)  # the RDP orders alpha epsilon is minimised over
_REPLACE_ONE = NeighboringRelation.REPLACE_ONE


@functools.lru_cache(maxsize=1)
def _replace_one_factor() -> float:
    """sigma's factor for the RDP accountant's GaussianDpEvent under REPLACE_ONE.

    Replacing one party's clipped update moves the sum by up to 2C, twice the bound C that
    GaussianDpEvent's multiplier (noise std / C) refers to. dp-accounting's RDP accountant (0.6.0) reads
    that multiplier against a shift of C under REPLACE_ONE (google/differential-privacy issue #378), so
    it must get sigma / 2; the PLD accountant shifts by 2C itself. Probed at sampling ratio 1, where both
    readings are closed forms, so a library that fixes this gets sigma unchanged.
    """

    def epsilon_at_order_2(event: dp_event.DpEvent, relation: NeighboringRelation) -> float:
        accountant = rdp_privacy_accountant.RdpAccountant([2.0], relation)
        accountant.compose(event)
        return accountant.get_epsilon(1e-5)

    full = epsilon_at_order_2(
        dp_event.SampledWithoutReplacementDpEvent(1, 1, dp_event.GaussianDpEvent(1.0)), _REPLACE_ONE
    )
    shift = {
        distance: epsilon_at_order_2(
            dp_event.GaussianDpEvent(1.0 / distance), NeighboringRelation.ADD_OR_REMOVE_ONE
        )
        for distance in (1.0, 2.0)
    }
    if math.isclose(full, shift[1.0], rel_tol=1e-9):
        return 0.5  # the library shifts by C: hand it sigma / 2
    if math.isclose(full, shift[2.0], rel_tol=1e-9):
        return 1.0  # the library shifts by 2C itself
    raise RuntimeError("dp-accounting's REPLACE_ONE Gaussian accounting is neither known reading")


@functools.lru_cache(maxsize=32)
def _round_rdp(event: dp_event.DpEvent) -> tuple[float, ...] | None:
    """One round's RDP at each of ORDERS (RDP adds up over rounds), read from the accountant's per-order
    array `_rdp` (not public API: None when it is absent, and epsilon then comes from compose(event, n))."""
    accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS), _REPLACE_ONE)
    accountant.compose(event)
    rdp = getattr(accountant, "_rdp", None)
    return None if rdp is None or len(rdp) != len(ORDERS) else tuple(float(v) for v in rdp)


class PrivacyAccountant:
    """Client-level (epsilon, delta) of a run so far, from Google's dp-accounting library (RDP accountant;
    `accountant="pld"` for its PLD accountant): each round is `SampledWithoutReplacementDpEvent(population,
    sample_size, GaussianDpEvent(noise_multiplier))` (fixed-size sampling of parties without replacement,
    as the run's schedule draws them; neighbouring relation REPLACE_ONE, which that event requires), composed
    once per round.

    Neighbouring runs differ in one party's data, the number of parties n (population) public. Replacing
    one party moves the sum of clipped updates by up to 2C, so the RDP accountant gets the multiplier
    sigma / 2 (see `_replace_one_factor`; Wang, Balle, Kasiviswanathan, AISTATS 2019, Theorem 27, for
    the subsampled bound). dp-accounting's PLD accountant has no sampling without replacement: "pld"
    needs every party in every round (sample_size = population), where a round is
    `GaussianDpEvent(noise_multiplier)` under REPLACE_ONE (tight; the RDP bound is looser).
    The figures assume all sampled parties' noise reaches the sum (see `noise_std`).
    """

    def __init__(
        self,
        noise_multiplier: float,
        population: int,
        sample_size: int,
        delta: float,
        accountant: str = "rdp",
    ) -> None:
        _check_settings(noise_multiplier, population, sample_size, delta, accountant)
        self.noise_multiplier = float(noise_multiplier)
        self.population = int(population)
        self.sample_size = int(sample_size)
        self.delta = float(delta)
        self.accountant = accountant
        self.rounds = 0
        self._epsilons: dict[int, float] = {0: 0.0}
        if self.delta >= 1 / self.population:
            log.warning(
                "dp_delta %g is not below 1 / %d parties: it allows one party's data to be exposed outright",
                delta,
                population,
            )

    def event(self) -> dp_event.DpEvent:
        """The DpEvent one round composes (its multiplier as the chosen accountant reads it)."""
        if self.accountant == "pld":
            return dp_event.GaussianDpEvent(self.noise_multiplier)
        gaussian = dp_event.GaussianDpEvent(self.noise_multiplier * _replace_one_factor())
        return dp_event.SampledWithoutReplacementDpEvent(self.population, self.sample_size, gaussian)

    def step(self, rounds: int = 1) -> float:
        """Compose `rounds` (>= 1) more rounds; epsilon after them."""
        _check_count(rounds, 1, "rounds")
        self.rounds += int(rounds)
        return self.epsilon()

    def epsilon(self) -> float:
        """Epsilon for delta after the rounds so far (0.0 before any)."""
        return self.epsilon_after(self.rounds)

    def epsilon_after(self, rounds: int) -> float:
        """Epsilon for delta after `rounds` rounds in all (>= 0), composing nothing; cached per count."""
        _check_count(rounds, 0, "rounds")
        rounds = int(rounds)
        if rounds not in self._epsilons:
            self._epsilons[rounds] = self._compute(rounds)
        return self._epsilons[rounds]

    def _compute(self, rounds: int) -> float:
        event = self.event()
        rdp = _round_rdp(event) if self.accountant == "rdp" else None
        if rdp is not None:  # rounds x one round's RDP, what compose(event, rounds) would hold
            return float(
                rdp_privacy_accountant.compute_epsilon(ORDERS, [rounds * r for r in rdp], self.delta)[0]
            )
        if self.accountant == "rdp":
            accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS), _REPLACE_ONE)
        else:
            accountant = pld_privacy_accountant.PLDAccountant(_REPLACE_ONE)
        accountant.compose(event, rounds)
        return float(accountant.get_epsilon(self.delta))

    def rounds_within(self, target_epsilon: float, limit: int) -> int:
        """The most rounds in all (<= limit, counting those composed) whose epsilon stays <= target.
        Binary search: epsilon never falls as rounds are added."""
        if not (isinstance(target_epsilon, numbers.Real) and target_epsilon >= 0):
            raise ValueError(f"privacy_args.dp_target_epsilon must be a number >= 0; got {target_epsilon!r}")
        _check_count(limit, 0, "limit")
        low, high = 0, int(limit)
        if self.epsilon_after(high) <= target_epsilon:
            return high
        while high - low > 1:  # epsilon_after(low) <= target < epsilon_after(high)
            middle = (low + high) // 2
            if self.epsilon_after(middle) <= target_epsilon:
                low = middle
            else:
                high = middle
        return low

    def _settings(self) -> dict:
        return {
            "noise_multiplier": self.noise_multiplier,
            "population": self.population,
            "sample_size": self.sample_size,
            "delta": self.delta,
            "accountant": self.accountant,
        }

    def state(self) -> dict:
        """JSON values only: {"rounds": ...} plus the settings."""
        return {"rounds": self.rounds, **self._settings()}

    def load_state(self, state: dict) -> None:
        """Restore `state()`'s rounds; refuses a state whose settings differ from this accountant's."""
        if not isinstance(state, dict):
            raise ValueError(
                f"a privacy accountant's state is a dict from state(); got {type(state).__name__}"
            )
        differ = [
            f"{key} {state.get(key)!r} (this run: {value!r})"
            for key, value in self._settings().items()
            if state.get(key) != value
        ]
        if differ:
            raise ValueError(
                "the saved privacy accountant was for other settings: " + ", ".join(differ) + "; resume "
                "with the run's privacy_args, train_args.client_num_in_total and client_num_per_round, "
                "or start anew"
            )
        rounds = state.get("rounds")
        _check_count(rounds, 0, "the saved state's rounds")
        self.rounds = int(rounds)


def _check_count(value: object, least: int, what: str) -> None:
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least):
        raise ValueError(f"{what} must be an integer >= {least}; got {value!r}")


def _check_settings(sigma: float, population: int, sample_size: int, delta: float, accountant: str) -> None:
    """ValueError naming the config key at fault and a fix."""
    if not (isinstance(sigma, numbers.Real) and math.isfinite(sigma) and sigma > 0):
        raise ValueError(
            f"privacy_args.dp_noise_multiplier must be a finite number > 0 for an epsilon; got {sigma!r} "
            "(set e.g. 1.0: noise std sigma x dp_clip_norm on the round's sum)"
        )
    if not (isinstance(delta, numbers.Real) and 0 < delta < 1):
        raise ValueError(
            f"privacy_args.dp_delta must be in (0, 1); got {delta!r} (use one below 1 / parties)"
        )
    for key, value in (("client_num_in_total", population), ("client_num_per_round", sample_size)):
        _check_count(value, 1, f"train_args.{key}")
    if sample_size > population:
        raise ValueError(
            f"train_args.client_num_per_round ({sample_size}) must not exceed train_args.client_num_in_total "
            f"({population}): a round samples parties without replacement; lower it"
        )
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"privacy_args.dp_accountant must be one of {', '.join(ACCOUNTANTS)}; got {accountant!r}"
        )
    if accountant == "pld" and sample_size != population:
        raise ValueError(
            "privacy_args.dp_accountant 'pld': dp-accounting's PLD accountant has no fixed-size sampling "
            f"without replacement ({sample_size} of {population} parties a round); use 'rdp', or set "
            "train_args.client_num_per_round to client_num_in_total"
        )
