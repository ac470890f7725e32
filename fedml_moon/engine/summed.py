"""The server's rounds in sum form (`privacy.sums`): the server algorithm's `aggregate_sums` makes
the new global state from the round's sums, never from the uploads one by one.

Two users: `privacy_args` (each party's vector, summed securely or plainly: `aggregate_private`), and
`train_args.stream_uploads` (`fold` each chunk of uploads into running float64 sums as soon as it is
trained, then `close_stream`), so that a round of many parties holds one chunk's uploads at a time,
not the round's. A member of `engine.rounds.ServerRounds`; pure PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch

from fedml_moon.algorithms.base import Payload, ServerAlgorithm
from fedml_moon.core.aggregation import payload_nbytes, payload_numel
from fedml_moon.core.validate import BadUpload
from fedml_moon.privacy.mod import secure_sum
from fedml_moon.privacy.party import PartyVector, party_vector
from fedml_moon.privacy.sums import Sums, contribution

Result = tuple[float, Payload]  # (number of samples, upload)


def sum_form_problem(algorithm: ServerAlgorithm | type, spec: dict, name: str) -> str | None:
    """Why the sum form would not carry what `algorithm`'s uploads hold (`spec`: its `upload_spec`),
    or None. Every upload field but the party's id must be named in `summed` (a field it does not name
    would be dropped from the round's sums), every field it names must be in the upload, and an
    algorithm that sums more than the model reads it back in its own `aggregate_sums`."""
    cls = algorithm if isinstance(algorithm, type) else type(algorithm)
    kind, summed = cls.__name__, cls.summed
    lost = sorted(k for k in spec if k not in summed and k != "party_id")
    if lost:
        return (
            f"{name}'s uploads hold {lost}, which {kind}.summed does not name, so the round's sums would "
            f'drop them; add each to summed ("update": the weighted mean change from what was sent, '
            f'"sum": summed as it is) and read it back in {kind}.aggregate_sums'
        )
    absent = sorted(k for k in summed if k not in spec)
    if absent:
        return f"{kind}.summed names {absent}, which {name}'s upload_spec does not hold; name upload fields"
    if set(summed) - {"model"} and cls.aggregate_sums is ServerAlgorithm.aggregate_sums:
        extra = sorted(set(summed) - {"model"})
        return (
            f"{kind}.summed names {extra}, but {kind}.aggregate_sums is ServerAlgorithm's, which reads "
            f"only 'model': override aggregate_sums to read {extra} from the sums"
        )
    return None


def add_into(total: Any, part: Any) -> Any:
    """`total` + `part` for trees of float64 tensors (dicts or tensors), in place where `total` has them."""
    if total is None:
        return part
    if isinstance(part, dict):
        return {k: add_into(total.get(k), v) for k, v in part.items()}
    return total.add_(part)


class SummedRounds:
    """Aggregation by sums: a member of `ServerRounds` (`server`), whose aggregator, totals, downloads
    and checks it uses; its own: the running sums of a streamed round."""

    def __init__(self, server: Any) -> None:
        self.server = server  # the ServerRounds this is part of
        self.stream: dict[str, Any] | None = None  # train_args.stream_uploads: this round's running sums

    def aggregate_private(self, round_idx: int, results: dict[int, Result]) -> list[Result]:
        """privacy_args in this process (the standalone simulation): each party's vector
        (`privacy.party`), their sum (`private_sum`), then `apply_sums`."""
        privacy = self.server.privacy
        vectors = {p: party_vector(u, self.server.sent[p], privacy.plan(p)) for p, (_, u) in results.items()}
        return self.apply_sums(self.private_sum(round_idx, vectors))

    def private_sum(self, round_idx: int, vectors: dict[int, PartyVector]) -> Sums:
        """The parties' vectors summed securely (SecAgg run among them here) or plainly, read back as
        the round's `Sums` (`PrivateAggregation.finish`: DP's noise and accounting). Counted in
        bytes_up: each party's masked vector."""
        privacy = self.server.privacy
        if privacy.options.secure_aggregation:
            total, parties = secure_sum(round_idx, vectors, privacy.params(len(vectors)))
        else:
            parties = sorted(vectors)
            total = torch.stack([vectors[p].vector for p in parties]).sum(dim=0)
        first = vectors[parties[0]]
        self.server.totals["params_up"] += first.vector.numel() * len(vectors)
        self.server.totals["bytes_up"] += first.vector.numel() * len(vectors) * privacy.word_bytes()
        return privacy.finish(total, first.entries, first.metric_names, parties, round_idx)

    def apply_sums(self, sums: Sums, stand_ins: list[Result] | None = None) -> list[Result]:
        """The new global state from the round's sums (the aggregator's `aggregate_sums`, then FedML's
        on_after_aggregation and set); returns the round's record of the summed parties: `stand_ins`,
        or one per party holding the round's mean metrics."""
        new_state = self.server.aggregator.on_after_aggregation(self.server.aggregator.aggregate_sums(sums))
        self.server.aggregator.set_model_params(new_state)
        return stand_ins if stand_ins is not None else [(1.0, {"metrics": dict(sums.metrics)})] * sums.count

    # --- train_args.stream_uploads ---------------------------------------------------------------
    def fold(self, round_idx: int, results: dict[int, Result]) -> None:
        """Add a chunk of this round's results to the running sums (weights: the server algorithm's
        `sum_weight`), after the checks `aggregate` makes; what is kept of each upload is its metrics."""
        if self.stream is None or self.stream["round"] != round_idx:
            self.stream = {"round": round_idx, "fields": None, "weight": 0.0, "kept": {}, "rejected": {}}
        stream, algorithm = self.stream, self.server.aggregator.algorithm
        results = self.server.weighed(results)
        usable, rejected = self.server.uploads.check_uploads(round_idx, results)
        stream["rejected"].update(rejected)
        for party in usable:
            n, upload = results[party]
            self.server.totals["bytes_up"] += payload_nbytes(upload)
            self.server.totals["params_up"] += payload_numel(upload)
            ratio = float(algorithm.sum_weight(n))
            part = contribution(upload, self.server.sent[party], algorithm.summed, ratio)
            stream["fields"] = add_into(stream["fields"], part)
            stream["weight"] += ratio
            stream["kept"][party] = (n, {"metrics": dict(upload.get("metrics") or {})})

    def close_stream(self, round_idx: int) -> list[Result]:
        """The round's new global state from its running sums; the parties' stand-ins (samples,
        metrics) in the schedule's order for the round's record."""
        stream = self.stream if self.stream is not None and self.stream["round"] == round_idx else None
        self.stream, self.server.rejected = None, dict(stream["rejected"]) if stream else {}
        if not stream or not stream["kept"]:
            raise BadUpload(f"round {round_idx}: no usable upload ({self.server.rejected})")
        kept = stream["kept"]
        stand_ins = [kept[p] for p in self.server.parties(round_idx) if p in kept]
        return self.apply_sums(Sums(stream["weight"], len(kept), stream["fields"]), stand_ins)
