"""Independent random streams derived from the run's one seed (`common_args.random_seed`).

Each consumer of randomness draws from its own stream: a child of ``numpy.random.SeedSequence(seed)``
with a fixed spawn key per purpose (the same child ``SeedSequence(seed).spawn(n)[i]`` would give).
Children of one SeedSequence are statistically independent of each other and of the root, so the
sampling schedule never replays the partition's draws, and adding a consumer shifts no other stream.

The training partition keeps the root stream ``numpy.random.default_rng(seed)``, so partitions are
the ones published with earlier versions (and in docs/results.md). The loaders' batch orders
come from ``SeedSequence([seed, party_id + 1])`` (`fedml_moon.data.loader`), another independent
root.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

# purpose -> spawn key; never renumber (that would change every run's draws for that purpose)
STREAMS: dict[str, int] = {
    "sampling": 0,  # which parties train in each round
    "test_split": 1,  # the parties' local test splits
    "subsample_train": 2,  # data_args.max_train_samples
    "subsample_test": 3,  # data_args.max_test_samples
    "party_init": 4,  # MOON's own random initialisation of a party (unseen_party_prev: own-init)
    "prototypes": 5,  # FedSSC's random choice of the parties behind each class prototype
    "site_test_split": 6,  # a site's own data without a test split: its seeded local test share
    "algorithm": 7,  # an algorithm's own draws: ClientAlgorithm.generator / ServerAlgorithm.generator
    "evaluation": 8,  # validation_args.eval_parties: the parties that test their own models in a round
    "network": 9,  # a network's own draws (dropout, stochastic depth) in a party's local round
    "party_speed": 10,  # train_args.party_speed: each party's simulated seconds per local round
    "buffered": 11,  # server_args.aggregation: buffered: the party that takes each freed slot
    "arrivals": 12,  # server_args.arrival_rate: the gaps between parties arriving (core.presence)
}


def seed_sequence(seed: int, purpose: str, *extra: int) -> np.random.SeedSequence:
    """The SeedSequence of `purpose` (a key of STREAMS), optionally split further by `extra` ints."""
    if purpose not in STREAMS:
        raise KeyError(f"unknown random stream {purpose!r}; known: {', '.join(STREAMS)}")
    return np.random.SeedSequence(int(seed), spawn_key=(STREAMS[purpose], *(int(e) for e in extra)))


def rng(seed: int, purpose: str, *extra: int) -> np.random.Generator:
    """A numpy Generator on the stream of `purpose`."""
    return np.random.default_rng(seed_sequence(seed, purpose, *extra))


def torch_seed(seed: int, purpose: str, *extra: int) -> int:
    """A 63-bit integer for ``torch.manual_seed`` / ``torch.Generator.manual_seed`` from the stream."""
    return int(seed_sequence(seed, purpose, *extra).generate_state(1, dtype=np.uint64)[0]) >> 1


@contextlib.contextmanager
def own_random(seed: int, round_idx: int, party: int, device: torch.device) -> Iterator[None]:
    """torch's global random state (and `device`'s, for CUDA) seeded from the stream "network" of
    (round, party) inside, restored after: the draws of a network's dropout or stochastic depth in
    a party's local round are that party's and round's, whatever trained before it, in whatever
    process; the run's other draws are as they were."""
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(torch_seed(seed, "network", round_idx, party))
        yield
