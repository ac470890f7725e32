"""Party sampling: the sampled sets for all rounds are drawn up front from the seed."""

from __future__ import annotations

from fedml_moon.core.seeds import rng


def sample_schedule(n_total: int, n_per_round: int, rounds: int, seed: int) -> list[list[int]]:
    """For each round, the sorted ids of the parties that train (all of them when n_per_round == n_total).

    Drawn on the run seed's own "sampling" stream, independent of the partition's.
    """
    if not 1 <= n_per_round <= n_total:
        raise ValueError(f"n_per_round must be in [1, {n_total}]; got {n_per_round}")
    if n_per_round == n_total:
        return [list(range(n_total)) for _ in range(rounds)]
    gen = rng(seed, "sampling")
    return [sorted(int(p) for p in gen.choice(n_total, n_per_round, replace=False)) for _ in range(rounds)]


def quorum(min_reports: int | str, sampled: int) -> int:
    """How many of a round's `sampled` parties must report for it to go on without the others
    (`comm_args.min_reports`): `half` (the default) = ceil(sampled / 2), `all` = every one, an
    integer = that many (at most `sampled`). Under secure aggregation with DP it is also the fewest
    parties whose sum a round may reveal (`privacy.mod.PrivateAggregation`)."""
    if min_reports == "all":
        return sampled
    if min_reports == "half":
        return max(1, (sampled + 1) // 2)
    return min(int(min_reports), sampled)
