"""One seed, independent streams: sampling, test splits and subsampling never replay the partition's draws."""

from __future__ import annotations

import numpy as np
import pytest

from fedml_moon.core.partition import dirichlet_partition
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.core.seeds import STREAMS, rng, seed_sequence, torch_seed


def test_streams_differ_from_the_root_and_from_each_other():
    draws = {name: rng(7, name).random(64) for name in STREAMS}
    draws["root"] = np.random.default_rng(7).random(64)
    names = sorted(draws)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not np.allclose(draws[a], draws[b]), (a, b)
    # ...and are uncorrelated: |corr| of 64 uniform pairs stays far below 1 (0.5 is > 4 sigma)
    root = draws.pop("root")
    assert all(abs(np.corrcoef(root, d)[0, 1]) < 0.5 for d in draws.values())


def test_a_stream_is_a_spawned_child_of_the_seed():
    spawned = np.random.SeedSequence(3).spawn(len(STREAMS))
    for name, key in STREAMS.items():
        ours, theirs = seed_sequence(3, name), spawned[key]
        assert np.array_equal(ours.generate_state(4), theirs.generate_state(4))


def test_sampling_schedule_does_not_replay_the_partition_stream():
    """Before: both drew on default_rng(seed), so the schedule repeated the partition's random numbers."""
    seed = 0
    replay = np.random.default_rng(seed)
    same_stream = [sorted(int(p) for p in replay.choice(10, 3, replace=False)) for _ in range(5)]
    assert sample_schedule(10, 3, 5, seed) != same_stream
    assert sample_schedule(10, 3, 5, seed) == sample_schedule(10, 3, 5, seed)


def test_party_streams_are_split_further():
    assert torch_seed(0, "party_init", 1) != torch_seed(0, "party_init", 2)
    assert torch_seed(0, "party_init", 1) == torch_seed(0, "party_init", 1)
    assert 0 <= torch_seed(5, "party_init", 9) < 2**63
    with pytest.raises(KeyError, match="unknown random stream"):
        rng(0, "nope")


def test_published_partition_is_unchanged():
    """The training partition stays on the root stream default_rng(seed): these sizes are those of
    every earlier version (and of the partitions behind the README's tables)."""
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 100))
    parts = dirichlet_partition(y, 10, 0.5, seed=0)
    assert [len(p) for p in parts] == [81, 58, 136, 128, 89, 100, 99, 49, 150, 110]
    assert parts[0][:5].tolist() == [122, 916, 388, 289, 655]
