"""FedML ServerAggregator that runs any registered algorithm's server side."""

from __future__ import annotations

import statistics
from collections import OrderedDict
from typing import Any

import torch
from fedml.core import ServerAggregator
from torch import nn

from fedml_moon.adapters.trainer import as_payload
from fedml_moon.algorithms.base import Payload, ServerAlgorithm
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.evaluation import evaluate
from fedml_moon.privacy.sums import Sums


class PluginServerAggregator(ServerAggregator):
    """Holds the global state; `aggregate` returns one OrderedDict (one model for every party)."""

    def __init__(self, model: nn.Module, args: Any, algorithm: ServerAlgorithm) -> None:
        super().__init__(model, args)
        self.algorithm = algorithm
        algorithm.trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        self.global_state: OrderedDict = algorithm.setup(clone_state(model.state_dict()))
        model.load_state_dict(self.global_state)

    def get_model_params(self) -> Payload:
        return self.algorithm.download(self.global_state)

    def get_model_params_for(self, party_id: int) -> Payload:
        """The payload for one party (algorithms that send parties different things override download)."""
        return self.algorithm.download(self.global_state, party_id)

    def set_model_params(self, model_parameters: Any) -> None:
        self.global_state = OrderedDict(as_payload(model_parameters)["model"])

    def aggregate(self, raw_client_model_or_grad_list: list[tuple[float, Payload]]) -> OrderedDict:
        uploads = [(float(n), as_payload(p)) for n, p in raw_client_model_or_grad_list]
        return self.algorithm.aggregate(self.global_state, uploads)

    def aggregate_sums(self, sums: Sums) -> OrderedDict:
        """The new global state from the round's sums alone (`privacy_args`: the server holds no upload)."""
        return self.algorithm.aggregate_sums(self.global_state, sums)

    def after_evaluation(self, round_idx: int, metrics: dict) -> None:
        """Hand an evaluated round's metrics to the server algorithm (it may change the global state)."""
        self.global_state = self.algorithm.after_evaluation(round_idx, metrics, self.global_state)
        self.model.load_state_dict(self.global_state)

    def test(self, test_data: Any, device: torch.device, args: Any) -> dict[str, float]:
        """Accuracy and loss on `test_data`; mean and std over models when several are evaluated (SOLO)."""
        results = []
        for state in self.algorithm.models_to_evaluate(self.global_state).values():
            self.model.load_state_dict(state)
            self.model.to(device)
            results.append(evaluate(self.model, test_data, device))
        accs = [a for a, _ in results]
        out = {"test_acc": statistics.fmean(accs), "test_loss": statistics.fmean(loss for _, loss in results)}
        if len(results) > 1:
            out["test_acc_std"] = statistics.pstdev(accs)
            out["models_evaluated"] = len(results)
        self.model.load_state_dict(self.global_state)
        return out

    def test_all(self, train_data_local_dict: Any, test_data_local_dict: Any, device: Any, args: Any) -> bool:
        return True
