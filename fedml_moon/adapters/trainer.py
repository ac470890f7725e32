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

from fedml_moon.algorithms.base import ClientAlgorithm, Payload
from fedml_moon.algorithms.batched import PartyJob, train_parties
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.evaluation import evaluate
from fedml_moon.core.state import PartyStore

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
        party = party_of(train_data)
        check_loader_device(train_data, device)
        round_idx = int(getattr(args, "round_idx", 0) or 0)
        if self.received is None:
            self.received = {"model": clone_state(self.model.state_dict())}
        state = self.store.get(party)
        self.last_metrics = self.algorithm.local_train(
            self.model, self.received, state, train_data, device, round_idx, party
        )
        self.store.put(party, state)
        self.outgoing = self.algorithm.upload(self.model, state, party)
        self.outgoing["metrics"] = dict(self.last_metrics)
        log.debug("round %d party %d: %s", round_idx, party, self.last_metrics)

    def train_many(self, loaders: list, downloads: list, device: torch.device, round_idx: int) -> list | None:
        """Several parties' local rounds trained together (algorithms/batched.py); their uploads, or
        None when the algorithm has no batched form (nothing has changed then)."""
        if not self.algorithm.has_batched_form():
            return None
        jobs = []
        for data, download in zip(loaders, downloads, strict=True):
            check_loader_device(data, device)
            party = party_of(data)
            jobs.append(PartyJob(party, as_payload(download), self.store.get(party), data))
        results = train_parties(self.algorithm, self.model, jobs, device, round_idx)
        if results is None:
            return None
        uploads = []
        for job, (metrics, upload) in zip(jobs, results, strict=True):
            self.store.put(job.party, job.state)
            upload["metrics"] = dict(metrics)
            uploads.append(upload)
        self.outgoing = None
        return uploads

    def test(self, test_data: Any, device: torch.device, args: Any) -> dict[str, float]:
        acc, loss = evaluate(self.model, test_data, device)
        return {"test_acc": acc, "test_loss": loss}

    def evaluate_party(self, party: int, test_data: Any, received: Any, device: torch.device) -> Payload:
        """The party's own model (the server's model with the party's own state applied) on its own
        test split `test_data`: what it reports on evaluation rounds, with its personal state for the
        server's new test."""
        state = self.store.get(party)
        self.model.load_state_dict(self.algorithm.eval_state(as_payload(received), state))
        acc, _ = evaluate(self.model, test_data, device)
        report: Payload = {"party_id": party, "local_test_acc": acc}
        if self.algorithm.personalized:
            report["personal"] = self.algorithm.personal_state(state)
        return report
