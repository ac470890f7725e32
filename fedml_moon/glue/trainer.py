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
from fedml_moon.data.loader import FedMLDataset

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


class PartyRunner:
    """The parties one process trains and evaluates, through FedML's ClientTrainer calls: the
    standalone loop holds every party, a distributed worker or silo only its own."""

    def __init__(
        self,
        trainer: PluginClientTrainer,
        dataset: FedMLDataset,
        device: torch.device,
        args: Any,
        parallel: int = 1,
    ) -> None:
        self.num_local = dataset.train_data_local_num_dict
        self.train_local, self.test_local = dataset.train_data_local_dict, dataset.test_data_local_dict
        self.trainer, self.device, self.args = trainer, device, args
        self.parallel = parallel  # train_args.parties_in_parallel, resolved
        self._said_sequential = self._said_batched = False

    def train_many(self, tasks: list[tuple[int, Payload]], round_idx: int) -> list[tuple[float, Payload]]:
        """Local rounds of (party, download) tasks, `parallel` parties at a time; in task order."""
        if self.parallel <= 1 or len(tasks) <= 1:
            return [self.train(party, download, round_idx) for party, download in tasks]
        out: list[tuple[float, Payload]] = []
        for start in range(0, len(tasks), self.parallel):
            chunk = tasks[start : start + self.parallel]
            loaders = [self.train_local[p] for p, _ in chunk]
            uploads = self.trainer.train_many(loaders, [d for _, d in chunk], self.device, round_idx)
            if uploads is None:
                self._say_sequential()
                return out + [self.train(p, d, round_idx) for p, d in tasks[start:]]
            if not self._said_batched and len(chunk) > 1:
                log.info("round %d: %d parties trained together (batched)", round_idx, len(chunk))
                self._said_batched = True
            out += [(float(self.num_local[p]), u) for (p, _), u in zip(chunk, uploads, strict=True)]
        return out

    def _say_sequential(self) -> None:
        if not self._said_sequential:
            log.info(
                "%s has no batched form: its parties train one after another (train_args.parties_in_parallel "
                "is ignored)",
                self.trainer.algorithm.name,
            )
            self._said_sequential = True

    def train(self, party: int, download: Payload, round_idx: int) -> tuple[float, Payload]:
        """One party's local round; returns (number of samples, upload)."""
        trainer, data = self.trainer, self.train_local[party]
        self.args.round_idx = round_idx
        trainer.set_model_params(download)
        trainer.update_dataset(data, self.test_local[party], self.num_local[party])
        trainer.on_before_local_training(data, self.device, self.args)
        trainer.train(data, self.device, self.args)
        trainer.on_after_local_training(data, self.device, self.args)
        return float(self.num_local[party]), trainer.get_model_params()

    def state(self, parties: list[int]) -> dict[int, dict]:
        """Each party's stored state and its loader's random stream, for checkpoints."""
        store = self.trainer.store
        return {p: {"state": store.get(p), "rng": self.train_local[p].generator.get_state()} for p in parties}

    def load_state(self, states: dict[int, dict]) -> None:
        """Restore `state()`: the store holds exactly the checkpoint's states for these parties."""
        for party, saved in states.items():
            party = int(party)
            if saved["state"]:
                self.trainer.store.put(party, dict(saved["state"]))
            else:
                self.trainer.store.drop(party)
            self.train_local[party].generator.set_state(saved["rng"])

    def evaluate(self, party: int, download: Payload) -> Payload:
        """The party's report on an evaluation round (see PluginClientTrainer.evaluate_party)."""
        return self.trainer.evaluate_party(party, self.test_local[party], download, self.device)
