"""Federated evaluation under secure aggregation: the parties' test counts summed by SecAgg(+), so the
server learns the round's totals only, never a party's counts.

Each party's vector is its counts, [correct, seen, loss sum] per model evaluated, in a fixed-point
encoding of its own (`COUNTS`): 2^-16 resolution, so counts up to 2^30 sum exactly and a loss sum is
rounded to 1/65536, mod 2^62. The secure session is the training rounds' (keys, shares, masked
inputs, unmasking: the same crowd rules, threshold and graph, `secagg_params`), with this encoding in
place of `privacy_args.secagg_clip` / `secagg_bits`, which bound model updates. DP does not noise the
counts: epsilon covers the training data, and a test split is not part of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.party import PartyVector
from fedml_moon.privacy.secagg import SecAggParams

COUNTS = FixedPoint(clip=2.0**30, bits=47, k=62)  # scale 2^16: a count c encodes as c * 65536 exactly


def counts_params(options: PrivacyArgs, participants: int) -> SecAggParams:
    """The secure session's parameters for a round of `participants` parties' counts."""
    from fedml_moon.privacy.mod import secagg_params

    return dataclasses.replace(secagg_params(options, participants), encoding=COUNTS)


def counts_vector(test: Mapping[str, list], names: list[str]) -> torch.Tensor:
    """A party's counts {model: [correct, seen, loss sum]} as its vector (float64 [3 x models])."""
    return torch.tensor([float(v) for name in names for v in test[name]], dtype=torch.float64)


def counts_of(total: torch.Tensor, names: list[str]) -> dict[str, list]:
    """The decoded sum of the parties' vectors back as {model: [correct, seen, loss sum]}."""
    rows = total.reshape(len(names), 3).tolist()
    return {name: [round(c), round(s), float(loss)] for name, (c, s, loss) in zip(names, rows, strict=True)}


def counts_problem(counts: Mapping[str, list], names: list[str], claimed: int) -> str | None:
    """Why a secure sum of test counts {model: [correct, seen, loss sum]} cannot be honest parties'
    sum, or None: its samples are not the `claimed` test samples of the parties summed, a correct count
    lies outside [0, samples], or a loss sum is negative or not finite. The server sees only the sum,
    so these are the only checks it can make: a party's own counts inside it stay unchecked."""
    for name in names:
        correct, seen, loss = counts[name]
        if seen != claimed:
            return f"holds {seen} samples of {name!r}, not the {claimed} its parties claimed"
        if not 0 <= correct <= seen:
            return f"has {correct} correct of {seen} samples of {name!r}, outside [0, {seen}]"
        if not (math.isfinite(loss) and loss >= 0):
            return f"has a loss sum {loss!r} for {name!r}, not a finite number >= 0"
    return None


def secure_counts(
    round_idx: int, tests: Mapping[int, Mapping[str, list]], names: list[str], options: PrivacyArgs
) -> tuple[dict[str, list], list[int]]:
    """The sum of the parties' counts by SecAgg(+) run in this process (the standalone simulation),
    and the parties in it."""
    from fedml_moon.privacy.mod import secure_sum

    vectors = {p: PartyVector(counts_vector(t, names), [], []) for p, t in tests.items()}
    total, survivors = secure_sum(round_idx, vectors, counts_params(options, len(vectors)))
    return counts_of(total, names), survivors
