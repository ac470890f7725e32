"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021).

Local loss CE + mu * l_con (Eq. 4) with the global model as positive and the party's k previous
local models as negatives (Eq. 7). What the party keeps: a FIFO pool of its k most recently trained
models. What it sends and what the server does: FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import ClientAlgorithm, Context, LocalResult, Net, PartyRound, Payload
from fedml_moon.config.fields import choice
from fedml_moon.config.schema import require
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.losses import model_contrastive_loss, representation_l2_loss
from fedml_moon.core.seeds import torch_seed

UNSEEN_CHOICES = ("own-init", "global")
LOSS_CHOICES = ("contrastive", "l2")
POOL_UPDATES = ("trained", "every-round")


@dataclass
class MoonOptions:
    mu: float = 5.0
    """weight mu of the model-contrastive term l_con (FedSSC's mu_moon); 0 turns it off; >= 0"""
    temperature: float = 0.5
    """tau of l_con (and of FedSSC's l_glob); > 0 (the paper uses 0.5)"""
    pool_size: int = 1
    """k, the party's previous models used as negatives, a FIFO pool; >= 1"""
    unseen_party_prev: str = choice("own-init", UNSEEN_CHOICES)
    """the negative of a party that has not trained yet: own-init (its own random init) or global"""
    representation_loss: str = choice("contrastive", LOSS_CHOICES)
    """contrastive (l_con), or l2: ||z - z_glob||_2 in l_con's place (the paper's Table 5)"""
    pool_update: str = choice("trained", POOL_UPDATES)
    """the pool under sampling: trained (rounds the party trained) or every-round (the MOON code)"""

    def check(self) -> None:
        require(self.mu >= 0, "algorithm_args.mu", "must be >= 0 (0 gives plain FedAvg training)")
        require(self.temperature > 0, "algorithm_args.temperature", "tau must be > 0 (the paper uses 0.5)")
        require(self.pool_size >= 1, "algorithm_args.pool_size", "k must be >= 1 (the paper's default is 1)")
        require(
            self.unseen_party_prev in UNSEEN_CHOICES,
            "algorithm_args.unseen_party_prev",
            f"choose one of {', '.join(UNSEEN_CHOICES)}",
        )
        require(
            self.representation_loss in LOSS_CHOICES,
            "algorithm_args.representation_loss",
            f"choose one of {', '.join(LOSS_CHOICES)}",
        )
        require(
            self.pool_update in POOL_UPDATES,
            "algorithm_args.pool_update",
            f"choose one of {', '.join(POOL_UPDATES)} (trained: the models of rounds the party trained; "
            "every-round: the authors' code, the party's current model in each of the last k rounds)",
        )


def push_pool(pool: list, item: object, k: int) -> list:
    """FIFO of the k most recent items, oldest first: append, then drop from the front."""
    return (list(pool) + [item])[-k:]


class MoonClient(ClientAlgorithm):
    """The party side of MOON Algorithm 1 (PartyLocalTraining)."""

    name = "moon"
    terms = ("ce", "l_con")

    def initial_model(self, party_id: int) -> dict:
        """The party's own random initialisation, reproducible from the seed and the party id."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch_seed(self.seed, "party_init", int(party_id)))
            return clone_state(self.model_factory().state_dict())

    def _unseen(self, received: Payload, party_id: int) -> dict:
        """The model standing in for a party that has not trained yet (`unseen_party_prev`)."""
        if self.options.unseen_party_prev == "global":
            return received["model"]
        return self.initial_model(party_id)

    def previous_models(self, state: dict, received: Payload, round_idx: int, party_id: int) -> list:
        """The states used as negatives this round (oldest first).

        "trained": the party's k most recently trained models. "every-round" (the authors' code,
        which snapshots every party's current model after each round): for each of the last
        min(round, k) rounds, the party's model at the end of that round, repeats included.
        Round 0 has none either way (l_con == 0, as in the authors' code).
        """
        pool = state.get("pool", [])
        if round_idx == 0:
            return []
        if self.options.pool_update == "every-round":
            rounds = state.get("pool_rounds") or list(range(round_idx - len(pool), round_idx))
            first = max(0, round_idx - self.options.pool_size)
            return [self._model_after(pool, rounds, j, received, party_id) for j in range(first, round_idx)]
        return pool or [self._unseen(received, party_id)]

    def _model_after(self, pool: list, rounds: list[int], j: int, received: Payload, party_id: int) -> dict:
        """The party's model at the end of round j: its latest one trained in a round <= j."""
        trained = [state for state, r in zip(pool, rounds, strict=True) if r <= j]
        return trained[-1] if trained else self._unseen(received, party_id)

    def context(self, r: PartyRound) -> Context:
        """The global model w^t (shared: the positive's teacher) and the party's previous models (its
        own: the negatives' teachers), as state dicts; the l2 ablation has no negatives."""
        contrastive = self.options.representation_loss == "contrastive"
        prev = self.previous_models(r.state, r.received, r.round_idx, r.party) if contrastive else []
        model = r.received["model"]
        return Context(model, self.train_args.learning_rate, {"global": model}, {"prev": list(prev)})

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        """CE + mu * l_con (MOON Eq. 4)."""
        loss, terms, _ = self.moon_terms(net, x, y, ctx)
        return loss, terms

    def moon_terms(
        self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """CE + mu * l_con, its named terms, and the batch's projection z [B, D]: z from the party's
        network, z_glob and z_prev from the teachers in `ctx` (eval mode, no gradient)."""
        out = net(x)
        z_glob = net.frozen(ctx["global"], x).z
        z_prev = [net.frozen(s, x).z for s in ctx["prev"]]
        z = out.z
        ce = F.cross_entropy(out.logits, y)
        if self.options.representation_loss == "l2":
            l_con = representation_l2_loss(z, z_glob)
        else:
            l_con = model_contrastive_loss(z, z_glob, z_prev, self.options.temperature)
        return ce + self.options.mu * l_con, {"ce": ce.detach(), "l_con": l_con.detach()}, z

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """Pushes the trained model into the party's pool of k (FIFO); sends the model."""
        k = self.options.pool_size
        r.state["pool"] = push_pool(r.state.get("pool", []), clone_state(done.final), k)
        r.state["pool_rounds"] = push_pool(r.state.get("pool_rounds", []), int(r.round_idx), k)
        return super().finish(r, ctx, done)
