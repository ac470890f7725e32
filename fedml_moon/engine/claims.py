"""What a party says of its data, and what the server does with it.

A party's claim is `{"samples": n, "test_samples": m, "classes": [c, ...]}`: its training samples
(its weight in the average, unless `server_args.party_weights: uniform`), its test samples (what its
federated evaluation counts must add up to) and, for algorithms that share class prototypes
(FedSSC), the classes it holds more than `algorithm_args.min_class_samples` samples of (the only
classes it may speak for). Where the server computed the partition itself it derives every claim
(`engine.claim_table.ClaimTable.of`: columns, not a dict per party) and a party must claim exactly
that; where it holds no data (`config.own_data`) the parties' claims are all it knows: each is
bounded (`claim_problem`: at most `comm_args.max_party_samples`, or the party's own cap) and fixed
for the run when first made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedml_moon.engine.claim_table import ClaimTable

Claim = dict[str, Any]


def saved_claims(claims: Mapping[int, Claim]) -> dict[str, Any]:
    """Claims for a checkpoint: a `ClaimTable`'s columns as tensors (``{"table": ...}``), else one
    entry per party keyed by its id as a string (the form every checkpoint had before the table)."""
    if isinstance(claims, ClaimTable):
        return {"table": claims.state()}
    return {str(p): c for p, c in claims.items()}


def loaded_claims(saved: Mapping[str, Any] | None) -> Mapping[int, Claim]:
    """The claims `saved_claims` wrote (either form; an older checkpoint's dict, or nothing)."""
    if not saved:
        return {}
    if "table" in saved:
        return ClaimTable.from_state(saved["table"])
    return {int(p): dict(c) for p, c in saved.items()}


def claim_problem(claim: Any, cap: int, num_classes: int) -> str | None:
    """Why a party's claim cannot be taken, or None: samples in [1, cap], test_samples in [1, cap],
    classes distinct class indices in ascending order."""
    if not isinstance(claim, Mapping) or set(claim) != {"samples", "test_samples", "classes"}:
        return "a claim is {samples, test_samples, classes}"
    for key in ("samples", "test_samples"):
        n = claim[key]
        if type(n) is not int or not 1 <= n <= cap:
            return (
                f"{key} {repr(n)[:40]} is not a count in [1, {cap}] (comm_args.max_party_samples, or its own)"
            )
    classes = claim["classes"]
    if not isinstance(classes, list) or any(type(c) is not int for c in classes):
        return "classes is not a list of class indices"
    if classes != sorted(set(classes)) or any(not 0 <= c < num_classes for c in classes):
        return f"classes {classes[:10]} are not distinct ascending indices of the run's {num_classes} classes"
    return None


def differs(fixed: Claim, claim: Claim) -> str | None:
    """How `claim` differs from the party's `fixed` one (its first, or the server's own), or None."""
    keys = [k for k in ("samples", "test_samples", "classes") if fixed.get(k) != claim.get(k)]
    if not keys:
        return None
    return ", ".join(f"{k} {claim.get(k)!r:.60} (fixed: {fixed.get(k)!r:.60})" for k in keys)
