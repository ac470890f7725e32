"""FedML ClientTrainer that runs any registered algorithm's party side.

The party is identified by the data partition it is handed (`train_data.party_id`), never by the
trainer's FedML id, so per-party state stays with its party under sampling and in every mode.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from fedml.core import ClientTrainer
from torch import nn

from fedml_moon.algorithms.base import ClientAlgorithm, PartyRound, Payload
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.evaluation import evaluate, evaluate_counts, evaluate_ensemble_counts
from fedml_moon.core.state import PartyStore
from fedml_moon.engine.batched import PartyJob, train_parties
from fedml_moon.engine.local import to_device

log = logging.getLogger(__name__)


def as_payload(params: Any) -> Payload:
    """Accept the plugin's payload dict or a bare state dict (as FedML's own code may send)."""
    if isinstance(params, Mapping) and "model" in params:
        return dict(params)
    return {"model": params}


def _canonical(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def check_loader_device(train_data: Any, device: torch.device | str) -> None:
    """Refuse a loader that yields batches somewhere other than the training device."""
    loader_device = getattr(train_data, "device", None)
    if loader_device is not None and _canonical(loader_device) != _canonical(device):
        raise ValueError(
            f"party {getattr(train_data, 'party_id', '?')}: its loader yields batches on {loader_device} but "
            f"the trainer runs on {device}; build the loaders for the training device "
            "(fedml_moon.data.loader.build_fedml_dataset(..., device=device))"
        )


def party_of(train_data: Any) -> int:
    """The party (data partition) id a loader belongs to."""
    party = getattr(train_data, "party_id", None)
    if party is None:
        raise ValueError(
            "the training data has no party_id; build datasets with "
            "fedml_moon.data.loader.build_fedml_dataset"
        )
    return int(party)


HOST = torch.device("cpu")


class PluginClientTrainer(ClientTrainer):
    """Local training for one party at a time: loads the party's state, trains, stores it back."""

    def __init__(self, model: nn.Module, args: Any, algorithm: ClientAlgorithm, store: PartyStore) -> None:
        super().__init__(model, args)
        self.algorithm = algorithm
        self.store = store
        self.received: Payload | None = None
        self.outgoing: Payload | None = None
        self.last_metrics: dict[str, float] = {}

    def get_model_params(self) -> Payload:
        if self.outgoing is not None:
            return self.outgoing
        return {"model": clone_state(self.model.state_dict())}

    def set_model_params(self, model_parameters: Any) -> None:
        self.received = as_payload(model_parameters)
        self.outgoing = None

    def train(self, train_data: Any, device: torch.device, args: Any) -> None:
        """FedML's call: one party's local round (the party of `train_data`) from the last download."""
        if self.received is None:
            self.received = {"model": clone_state(self.model.state_dict())}
        round_idx = int(getattr(args, "round_idx", 0) or 0)
        (upload,) = self.train_many([train_data], [self.received], device, round_idx)
        self.outgoing, self.last_metrics = upload, dict(upload["metrics"])
        log.debug("round %d party %d: %s", round_idx, upload["party_id"], self.last_metrics)

    def train_many(
        self, loaders: list, downloads: list, device: torch.device, round_idx: int
    ) -> list[Payload]:
        """Parties' local rounds, trained together when there are several (`engine.batched`): their
        uploads with their metrics, in order; each party's state goes back to the store."""
        trainable = tuple(n for n, p in self.model.named_parameters() if p.requires_grad)
        jobs = []
        for data, download in zip(loaders, downloads, strict=True):
            check_loader_device(data, device)
            party = party_of(data)
            job_round = PartyRound(as_payload(download), self.store.get(party), round_idx, party, trainable)
            jobs.append(PartyJob(job_round, data))
        uploads = []
        for job, (metrics, upload) in zip(
            jobs, train_parties(self.algorithm, self.model, jobs, device), strict=True
        ):
            state = job.round.state if device == HOST else to_device(job.round.state, HOST)
            self.store.put(job.party, state)  # on the host or on disk: a GPU holds no party state
            upload["metrics"] = dict(metrics)
            uploads.append(upload)
        self.outgoing = None
        return uploads

    def test(self, test_data: Any, device: torch.device, args: Any) -> dict[str, float]:
        acc, loss = evaluate(self.model, test_data, device)
        return {"test_acc": acc, "test_loss": loss}

    def evaluate_party(self, party: int, test_data: Any, received: Any, device: torch.device) -> Payload:
        """The party's report on an evaluation round, on its own test split `test_data`: with `local`
        (the default), its own model's accuracy (the server's model with the party's own state applied)
        and, for personalised algorithms, its personal state for the server's new test; with `test`
        (federated evaluation), the counts [correct, seen, loss sum] of each model the server names
        ("global": the download's model; others in `test_models`)."""
        payload = as_payload(received)
        report: Payload = {"party_id": party}
        if payload.get("local", True):
            state = self.store.get(party)
            self.model.load_state_dict(self.algorithm.eval_state(payload, state))
            acc, _ = evaluate(self.model, test_data, device)
            report["local_test_acc"] = acc
            if self.algorithm.personalized:
                report["personal"] = self.algorithm.personal_state(state)
        if "combine" in payload:  # the new test: the parties' models combined
            report["test"] = {"new": list(combined_counts(self.model, payload, test_data, device))}
        elif "test" in payload:
            others = payload.get("test_models") or {}
            counts = {}
            for name in payload["test"]:
                self.model.load_state_dict(payload["model"] if name == "global" else others[name])
                counts[name] = list(evaluate_counts(self.model, test_data, device))
            report["test"] = counts
        return report


def combined_counts(model: nn.Module, payload: Payload, test_data: Any, device: torch.device) -> tuple:
    """Counts of the parties' models combined as the server says (`combine`: "average", one model in
    `states`; "ensemble", the mean softmax of every model in `states`) on `test_data`."""
    if payload["combine"] == "ensemble":
        return evaluate_ensemble_counts(model, payload["states"], test_data, device)
    model.load_state_dict(payload["states"][0])
    return evaluate_counts(model, test_data, device)
