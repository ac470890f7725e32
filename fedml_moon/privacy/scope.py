"""What a DP run's epsilon covers, said with the run: `summary.json`'s `dp_scope`.

The unit (one party's data), the adjacency, what is released under the guarantee, the accountant, each
reported epsilon with the observers it holds against, and what the run releases outside it (named, so
that no reader takes the figure for more than it is). The privacy page's table of every released value
says the same per observer (docs/explanation/privacy.md#every-released-value-and-who-sees-it).
"""

from __future__ import annotations

from typing import Any

SAMPLE_KNOWN = (
    "anyone who knows which parties each round summed: a reader of summary.json (its config holds the "
    "seed the schedule is drawn from), of privacy_ledger.jsonl (each release's parties) or of the W&B "
    "run's config, and every site (it is sent the seed with the run's settings)"
)
SITES_UNDER_SECAGG = (
    "; under secure aggregation a site also knows its own parties' noise shares: against a site holding "
    "c of a sum's k parties that sum carries sigma sqrt((k - c) / q), no figure reported"
)


def dp_scope(cfg: Any, summed: dict[str, str], federated: bool) -> dict[str, Any] | None:
    """`summary.json`'s statement of a DP run's guarantee under `cfg`, for a server algorithm that sums
    `summed` (field -> "update" | "sum"), the parties testing (`federated`: federated evaluation) or
    not; None without DP."""
    p = cfg.privacy_args
    if not p.dp:
        return None
    buffered = cfg.server_args.aggregation == "buffered"
    return {
        "unit": "one party: all of its training data",
        "adjacency": "replace one party's data, the number of parties public (a sum moves by up to 2 C)",
        "released": _released(summed),
        "accountant": f"dp-accounting, {p.dp_accountant.upper()}, delta {p.dp_delta:g}",
        "epsilon_against": {
            "dp_epsilon_release": (
                "an observer of the released models who does not know which parties each round summed"
                + (
                    " (a buffer's parties are no uniform sample: no amplification is claimed)"
                    if buffered
                    else ""
                )
            ),
            "dp_epsilon_sample_known": SAMPLE_KNOWN + (SITES_UNDER_SECAGG if p.secure_aggregation else ""),
            "dp_epsilon_server": (
                "the server, if no party colludes with it (it knows the sample)"
                if p.secure_aggregation
                else "none: under DP alone the server sees every upload"
            ),
        },
        "not_covered": _not_covered(cfg, federated),
    }


def _released(summed: dict[str, str]) -> list[str]:
    """What each round releases under epsilon: the global model moved by the clipped, noised sum."""
    out = ["the global model after each round (moved by the clipped, noised sum of the parties' updates)"]
    extra = sorted(k for k in summed if k != "model")
    if extra:
        out.append(f"what the algorithm sums with the update, clipped with it: {', '.join(extra)}")
    return out


def _not_covered(cfg: Any, federated: bool) -> list[str]:
    """What the run releases that the epsilon does not cover, to whom (the privacy page's table)."""
    out = [
        "the round's training metrics (train_loss and the loss terms): to the server, the records, W&B",
        "who took part in each round (the records, privacy_ledger.jsonl, the server's log): to the server "
        "and their readers; per-site rounds, messages and bytes: to the status port's operator",
        "the parties' claims (claims.json, the server's log): their sample and test counts, to the server",
        "message sizes and timing: to the server and the network",
    ]
    v, p = cfg.validation_args, cfg.privacy_args
    if federated or v.local_test or cfg.train_args.algorithm in ("lg", "solo"):
        out.append(
            "the parties' test figures (their counts; per site in party_test, local_test_acc, new_test_acc "
            "where reported): to the server and the records (under secure aggregation their sums only)"
        )
    if cfg.train_args.algorithm == "lg":
        out.append("the figures computed from LG-FedAvg's local layers, which DP never noises")
    if p.dp_buffers == "average":
        out.append("BatchNorm's running statistics (dp_buffers: average): averaged outside the clipped sum")
    if cfg.train_args.algorithm == "lg" and federated:
        out.append(
            "LG-FedAvg's local layers: each party reports them for the new test, and every site is sent the "
            "parties' models combined (each one's with new_test_method: ensemble)"
        )
    return out
