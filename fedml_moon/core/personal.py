"""Evaluation of the parties' own models (personalised algorithms, LG-FedAvg). Pure PyTorch.

* local test: each party's model on its own test split, the unweighted mean over parties;
* new test: the parties' models combined, on the global test set (a party that was never seen);
* `BestSoFar`: the LG-FedAvg authors' reporting (their main_lg.py), offered as `report_best`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

from fedml_moon.core.aggregation import clone_state, weighted_average
from fedml_moon.core.evaluation import evaluate, evaluate_ensemble

State = Mapping[str, torch.Tensor]


def local_test_accs(
    model: nn.Module, states: Sequence[State], test_local: Sequence[Iterable], device: torch.device
) -> list[float]:
    """Accuracy of party p's model `states[p]` on its own test split `test_local[p]`, for every p."""
    accs = []
    for state, loader in zip(states, test_local, strict=True):
        model.load_state_dict(state)
        accs.append(evaluate(model, loader, device)[0])
    return accs


def new_test(
    model: nn.Module,
    states: Sequence[State],
    test_global: Iterable,
    device: torch.device,
    method: str,
    average: Callable[[Sequence[State], list[float]], State] = weighted_average,
) -> tuple[float, float]:
    """Accuracy and loss on the global test set of the parties' models combined: "average" = the
    uniform parameter average (the authors' acc_test_avg; `average`: the server's upload average, so
    a robust rule stands here too), "ensemble" = the mean of their softmax."""
    if method == "ensemble":
        return evaluate_ensemble(model, states, test_global, device)
    model.load_state_dict(average(states, [1.0] * len(states)))
    return evaluate(model, test_global, device)


class PartyFigures(Protocol):
    """Figures a server algorithm reports from every party's own model beside every party's test split
    (`ServerAlgorithm.party_figures`): only the standalone simulation holds both."""

    def figures(
        self,
        model: nn.Module,
        states: Sequence[State],
        accs: Sequence[float],
        test_local: Sequence[Iterable],
        test_global: Iterable,
        device: torch.device,
    ) -> dict[str, float]:
        """This round's figures from the parties' models `states` and their local test `accs`."""
        ...

    def state(self) -> dict | None:
        """What a checkpoint keeps of it (tensors and JSON values)."""
        ...

    def load_state(self, state: dict | None) -> None:
        """Restore what `state()` returned."""
        ...


class BestSoFar:
    """The LG-FedAvg authors' figures (their main_lg.py): from the LG phase's start, every party keeps
    the model of the evaluated round where its local test accuracy was highest so far, the pool
    seeded with the LG start model (each party's start accuracy its own; a later model that ties
    replaces the kept one); the new test averages the parameters of all parties' best-so-far models;
    their local test puts that average's global layers into each party's best-so-far model. The
    reported figure is the round where this local test peaks. Before `begin` (a warm-up) it reports
    nothing. Selection on test data, so these figures are optimistic: they are reported beside, never
    instead of, the current models' `local_test_acc` / `new_test_acc`.
    """

    def __init__(self, global_keys: Sequence[str]) -> None:
        self.global_keys = list(global_keys)
        self.best: dict[int, tuple[float, OrderedDict]] = {}
        self.start: OrderedDict | None = None  # the LG start model, until it seeds the pool
        self.begun = False

    def begin(self, start: State) -> None:
        """The LG phase starts from the model `start`: it seeds every party's pool at the next
        evaluated round (the first call of `figures`)."""
        self.start, self.begun, self.best = clone_state(start), True, {}

    def seed(self, model: nn.Module, test_local: Sequence[Iterable], device: torch.device) -> None:
        """Every party's pool holds the start model, at its accuracy on that party's test split."""
        if self.start is None:
            return
        accs = local_test_accs(model, [self.start] * len(test_local), test_local, device)
        self.best = {p: (acc, self.start) for p, acc in enumerate(accs)}
        self.start = None

    def update(self, states: Sequence[State], accs: Sequence[float]) -> None:
        """Offer this round's party models with their local test accuracies (ties: the newer)."""
        for party, (state, acc) in enumerate(zip(states, accs, strict=True)):
            if party not in self.best or acc >= self.best[party][0]:
                self.best[party] = (acc, clone_state(state))

    def evaluate(
        self,
        model: nn.Module,
        test_local: Sequence[Iterable],
        test_global: Iterable,
        device: torch.device,
    ) -> dict[str, float]:
        """`local_test_acc_best_so_far` and `new_test_acc_best_so_far` (see the class docstring)."""
        states = [self.best[p][1] for p in sorted(self.best)]
        average = weighted_average(states, [1.0] * len(states))
        model.load_state_dict(average)
        new_acc, _ = evaluate(model, test_global, device)
        shared = {k: average[k] for k in self.global_keys}
        combined = [OrderedDict({**s, **shared}) for s in states]
        accs = local_test_accs(model, combined, test_local, device)
        return {"local_test_acc_best_so_far": sum(accs) / len(accs), "new_test_acc_best_so_far": new_acc}

    def figures(
        self,
        model: nn.Module,
        states: Sequence[State],
        accs: Sequence[float],
        test_local: Sequence[Iterable],
        test_global: Iterable,
        device: torch.device,
    ) -> dict[str, float]:
        """Nothing before `begin`; then `seed` (once), `update` with this round's models and `evaluate`
        (a `PartyFigures`)."""
        if not self.begun:
            return {}
        self.seed(model, test_local, device)
        self.update(states, accs)
        return self.evaluate(model, test_local, test_global, device)

    def state(self) -> dict | None:
        best = {str(p): [acc, s] for p, (acc, s) in self.best.items()}
        return {"begun": self.begun, "start": self.start, "best": best}

    def load_state(self, state: dict | None) -> None:
        state = state or {"begun": False, "start": None, "best": {}}
        if "begun" not in state:  # a checkpoint of a version whose pool was the party map itself
            state = {"begun": True, "start": None, "best": state}
        self.begun, self.start = bool(state["begun"]), state["start"]
        self.best = {int(p): (float(v[0]), v[1]) for p, v in state["best"].items()}
