"""The privacy accountant of DP-FedAvg runs (`privacy_args.dp_*`): client-level (epsilon, delta) from
Google's dp-accounting library, against two observers. A module of its own so that only runs with DP
import that library (about a second of start-up in every process otherwise).

Neighbouring runs differ in one party's data (REPLACE_ONE, the number of parties public): its clipped
contribution moves the round's sum by up to 2C. Each round records which parties' contributions are in
its sum and the noise the sum really carries (its multiplier sigma_r: sigma, or more under secure
aggregation when more parties than the noise quorum report; `privacy.mod`).

- Against the server (`epsilon_server`): it knows each round's sample, since it draws it and sends the
  work, so sampling buys nothing against it. A party's loss composes over the rounds its contribution
  was in, a Gaussian of multiplier sigma_r each; the figure is the largest over the parties.
- Against a third party who sees only the released models and not the sample (`epsilon_release`):
  each round is `SampledWithoutReplacementDpEvent(n, m, GaussianDpEvent(sigma_r))` (Wang, Balle,
  Kasiviswanathan, AISTATS 2019, Theorem 27), composed over every round; its bound can exceed the one
  without sampling (few parties, small sigma), so the figure is the smaller of the two. It holds only
  while the sample (the run's seed) is secret from that observer.

dp-accounting's RDP accountant (0.6.0) reads a GaussianDpEvent's multiplier against a shift of C under
REPLACE_ONE (google/differential-privacy issue #378), so the sampled event gets sigma / 2 while the
library needs it (`_replace_one_factor`); the unsampled Gaussian of a shift of 2C is written as
`GaussianDpEvent(sigma / 2)` under ADD_OR_REMOVE_ONE. The PLD accountant (`accountant="pld"`, every
party sampled every round) shifts by 2C itself under REPLACE_ONE.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedml_moon.privacy.options import ACCOUNTANTS

log = logging.getLogger(__name__)
ORDERS = tuple(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)  # the RDP orders alpha epsilon is minimised over
_REPLACE_ONE = NeighboringRelation.REPLACE_ONE
_ADD_OR_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE
Round = tuple[float, tuple[int, ...]]  # (the sum's noise multiplier, the parties in it)


@functools.lru_cache(maxsize=1)
def _replace_one_factor() -> float:
    """sigma's factor for the RDP accountant's GaussianDpEvent under REPLACE_ONE: 0.5 while the library
    reads the multiplier against a shift of C, 1.0 once it shifts by 2C itself. Probed at sampling
    ratio 1, where both readings are closed forms."""

    def epsilon_at_order_2(event: dp_event.DpEvent, relation: NeighboringRelation) -> float:
        accountant = rdp_privacy_accountant.RdpAccountant([2.0], relation)
        accountant.compose(event)
        return accountant.get_epsilon(1e-5)

    full = epsilon_at_order_2(
        dp_event.SampledWithoutReplacementDpEvent(1, 1, dp_event.GaussianDpEvent(1.0)), _REPLACE_ONE
    )
    shift = {d: epsilon_at_order_2(dp_event.GaussianDpEvent(1.0 / d), _ADD_OR_REMOVE) for d in (1.0, 2.0)}
    if math.isclose(full, shift[1.0], rel_tol=1e-9):
        return 0.5
    if math.isclose(full, shift[2.0], rel_tol=1e-9):
        return 1.0
    raise RuntimeError("dp-accounting's REPLACE_ONE Gaussian accounting is neither known reading")


def sampled_event(population: int, sample_size: int, sigma: float) -> dp_event.DpEvent:
    """One round against an observer who does not know the sample (RDP accountant, REPLACE_ONE)."""
    gaussian = dp_event.GaussianDpEvent(sigma * _replace_one_factor())
    return dp_event.SampledWithoutReplacementDpEvent(population, sample_size, gaussian)


def party_event(sigma: float) -> dp_event.DpEvent:
    """One round of a party whose contribution is in the sum, a shift of 2C (RDP, ADD_OR_REMOVE_ONE)."""
    return dp_event.GaussianDpEvent(sigma / 2)


@functools.lru_cache(maxsize=256)
def _rdp(event: dp_event.DpEvent, relation: NeighboringRelation) -> np.ndarray:
    """One event's RDP at each of ORDERS (RDP adds up over rounds)."""
    accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS), relation)
    accountant.compose(event)
    return np.asarray(accountant._rdp, dtype=np.float64)  # the library's per-order array


def rdp_epsilon(rdp: np.ndarray, delta: float) -> float:
    """Epsilon for delta from RDP at ORDERS (dp-accounting's conversion)."""
    if not np.any(rdp):
        return 0.0
    return float(rdp_privacy_accountant.compute_epsilon(ORDERS, list(rdp), delta)[0])


@functools.lru_cache(maxsize=256)
def _pld_epsilon(sigmas: tuple[float, ...], delta: float) -> float:
    """Epsilon of a party in rounds of multipliers `sigmas`, PLD accountant (REPLACE_ONE, tight)."""
    accountant = pld_privacy_accountant.PLDAccountant(_REPLACE_ONE)
    for sigma in sigmas:
        accountant.compose(dp_event.GaussianDpEvent(sigma))
    return float(accountant.get_epsilon(delta)) if sigmas else 0.0


@dataclass
class _Totals:
    """RDP so far: each party's rounds (unsampled), and every round sampled."""

    party: dict[int, np.ndarray] = field(default_factory=dict)
    sampled: np.ndarray = field(default_factory=lambda: np.zeros(len(ORDERS)))

    def copy(self) -> _Totals:
        return _Totals({p: v.copy() for p, v in self.party.items()}, self.sampled.copy())


class PrivacyAccountant:
    """Client-level (epsilon, delta) of a run so far, against the server and for the release (module
    docstring). `record` one round at a time; `epsilon_server`, `epsilon_release` after them."""

    def __init__(
        self,
        noise_multiplier: float,
        population: int,
        sample_size: int,
        delta: float,
        accountant: str = "rdp",
    ) -> None:
        _check_settings(noise_multiplier, population, sample_size, delta, accountant)
        self.noise_multiplier, self.delta = float(noise_multiplier), float(delta)
        self.population, self.sample_size, self.accountant = int(population), int(sample_size), accountant
        self.history: list[Round] = []
        self._totals = _Totals()
        if self.delta >= 1 / self.population:
            log.warning(
                "dp_delta %g is not below 1 / %d parties: it allows one party's data to be exposed outright",
                delta,
                population,
            )

    @property
    def rounds(self) -> int:
        return len(self.history)

    def record(self, parties: Iterable[int], noise_multiplier: float | None = None) -> None:
        """One round whose sum holds `parties`' contributions and noise of multiplier
        `noise_multiplier` (default: the run's sigma) relative to C."""
        sigma = self.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"a round's noise multiplier must be a finite number > 0; got {sigma!r}")
        one = (sigma, tuple(sorted({int(p) for p in parties})))
        self.history.append(one)
        self._add(one, self._totals)

    def _add(self, one: Round, totals: _Totals) -> None:
        if self.accountant != "rdp":
            return  # pld composes from the history itself
        sigma, ids = one
        totals.sampled = totals.sampled + _rdp(
            sampled_event(self.population, self.sample_size, sigma), _REPLACE_ONE
        )
        vector = _rdp(party_event(sigma), _ADD_OR_REMOVE)
        for p in ids:
            totals.party[p] = totals.party[p] + vector if p in totals.party else vector.copy()

    def epsilon_server(self) -> float:
        """Against a server that knows each round's sample: the largest over the parties of their
        rounds composed (0.0 before any round)."""
        return self._server_epsilon(self.history, self._totals)

    def epsilon_release(self) -> float:
        """Against an observer of the released models who does not know the sample: the smaller of
        every round composed with sampling and `epsilon_server`."""
        return self._release_epsilon(self.history, self._totals)

    def _server_epsilon(self, history: Sequence[Round], totals: _Totals) -> float:
        if self.accountant == "pld":
            mine: dict[int, list[float]] = {}
            for sigma, ids in history:
                for p in ids:
                    mine.setdefault(p, []).append(sigma)
            return max((_pld_epsilon(tuple(sorted(s)), self.delta) for s in mine.values()), default=0.0)
        return max((rdp_epsilon(v, self.delta) for v in totals.party.values()), default=0.0)

    def _release_epsilon(self, history: Sequence[Round], totals: _Totals) -> float:
        server = self._server_epsilon(history, totals)
        if self.accountant == "pld" or not history:  # pld: every party every round, nothing to gain
            return server
        return min(rdp_epsilon(totals.sampled, self.delta), server)

    def rounds_within(self, target: float, schedule: Sequence[Sequence[int]], server: bool) -> int:
        """How many more rounds of `schedule` (each round's sampled parties, all in its sum, at the run's
        sigma) keep the epsilon against the server (`server`) or of the release <= target."""
        if not (isinstance(target, numbers.Real) and target >= 0):
            raise ValueError(f"privacy_args.dp_target_epsilon must be a number >= 0; got {target!r}")
        history, totals = list(self.history), self._totals.copy()
        epsilon = self._server_epsilon if server else self._release_epsilon
        for done, ids in enumerate(schedule):
            one = (self.noise_multiplier, tuple(sorted(int(p) for p in ids)))
            history.append(one)
            self._add(one, totals)
            if epsilon(history, totals) > target:
                return done
        return len(schedule)

    def _settings(self) -> dict:
        return {
            "noise_multiplier": self.noise_multiplier,
            "population": self.population,
            "sample_size": self.sample_size,
            "delta": self.delta,
            "accountant": self.accountant,
        }

    def state(self) -> dict:
        """JSON values only: every round recorded, and the settings."""
        return {"history": [[sigma, list(ids)] for sigma, ids in self.history], **self._settings()}

    def load_state(self, state: dict) -> None:
        """Restore `state()`'s rounds; refuses a state whose settings differ from this accountant's."""
        if not isinstance(state, dict) or not isinstance(state.get("history"), list):
            raise ValueError("a privacy accountant's state is a dict from state(), with its rounds' history")
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
        self.history, self._totals = [], _Totals()
        for sigma, ids in state["history"]:
            self.record(ids, sigma)


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
