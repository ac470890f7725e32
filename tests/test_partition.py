"""Tests of the party splits in fedml_moon.core.partition and the partition table / heat map."""

from __future__ import annotations

import numpy as np
import pytest

from fedml_moon.core.partition import (
    PartitionError,
    class_matched_partition,
    dirichlet_partition,
    iid_partition,
    partition_counts,
    shard_partition,
)
from fedml_moon.core.parts import Parts, Positions, Sizes, sizes_of
from fedml_moon.data.plot import format_partition_table, save_partition_heatmap


def _labels(n_per_class: int = 100, n_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(n_classes), n_per_class))


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    assert all(p.dtype == np.int64 for p in parts)
    joined = np.concatenate(parts)
    assert len(joined) == n
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("beta", [0.1, 0.5, 5.0])
def test_dirichlet_disjoint_cover_and_min_size(beta: float) -> None:
    y = _labels()
    parts = dirichlet_partition(y, n_parties=10, beta=beta, seed=3)
    assert len(parts) == 10
    _assert_exact_cover(parts, len(y))
    assert min(len(p) for p in parts) >= 10


def test_dirichlet_seed_determinism() -> None:
    y = _labels()
    a = dirichlet_partition(y, 5, 0.5, seed=1)
    b = dirichlet_partition(y, 5, 0.5, seed=1)
    c = dirichlet_partition(y, 5, 0.5, seed=2)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(np.array_equal(np.sort(p), np.sort(q)) for p, q in zip(a, c, strict=True))


def test_dirichlet_small_beta_is_skewed_large_beta_is_balanced() -> None:
    y = _labels(n_per_class=200)
    skewed = partition_counts(y, dirichlet_partition(y, 10, 0.1, seed=0), 10)
    even = partition_counts(y, dirichlet_partition(y, 10, 100.0, seed=0), 10)
    assert (skewed == 0).sum() > 20
    assert (even == 0).sum() == 0


def _check_cap(y: np.ndarray, parts: list[np.ndarray], n_parties: int) -> int:
    """Assert no party got samples of a class while already holding >= N/n; return how often a cap hit."""
    counts = partition_counts(y, parts, int(y.max()) + 1)
    held = np.zeros(n_parties, dtype=np.int64)
    capped = 0
    for k in range(counts.shape[1]):
        over = held >= len(y) / n_parties
        assert np.all(counts[over, k] == 0)
        capped += int(over.sum())
        held += counts[:, k]
    return capped


def test_dirichlet_cap_on_parties_over_their_share() -> None:
    y = np.concatenate([np.zeros(900, np.int64), np.ones(100, np.int64)])
    capped = 0
    for seed in range(20):
        parts = dirichlet_partition(y, n_parties=2, beta=0.1, seed=seed, min_size=5)
        _assert_exact_cover(parts, len(y))
        capped += _check_cap(y, parts, 2)
    assert capped > 0


def test_dirichlet_cap_many_classes() -> None:
    y = _labels(n_per_class=50)
    parts = dirichlet_partition(y, n_parties=8, beta=0.1, seed=7)
    assert _check_cap(y, parts, 8) > 0


def test_dirichlet_impossible_requests() -> None:
    y = _labels(n_per_class=5, n_classes=2)
    with pytest.raises(PartitionError, match="need 110 samples"):
        dirichlet_partition(y, n_parties=11, beta=0.5, seed=0)
    with pytest.raises(PartitionError, match="too many parties for the data or beta is too small"):
        dirichlet_partition(np.zeros(10, np.int64), n_parties=5, beta=0.01, seed=0, min_size=2)
    with pytest.raises(PartitionError):
        dirichlet_partition(y, n_parties=2, beta=0.0, seed=0)


def test_iid_partition() -> None:
    parts = iid_partition(103, 10, seed=0)
    _assert_exact_cover(parts, 103)
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3
    assert all(np.array_equal(p, q) for p, q in zip(parts, iid_partition(103, 10, seed=0), strict=True))
    with pytest.raises(PartitionError):
        iid_partition(3, 4, seed=0)


def test_the_iid_split_is_the_array_split_of_earlier_versions_held_as_one_flat_array() -> None:
    """The same parties as `np.array_split` of the seeded permutation (so runs are the runs they were),
    held as one array and offsets: a party's indices are a view of it, its size an offset difference."""
    for n, k in ((103, 10), (10, 10), (1_000, 7), (5, 1)):
        parts = iid_partition(n, k, seed=3)
        perm = np.random.default_rng(3).permutation(n)
        expected = np.array_split(perm, k)
        assert isinstance(parts, Parts) and len(parts) == k and parts.flat.base is None
        assert [p.tolist() for p in parts] == [p.tolist() for p in expected]
        assert parts.sizes.tolist() == [len(p) for p in expected] and parts[-1].base is parts.flat
        assert [p.tolist() for p in parts[1:3]] == [p.tolist() for p in expected[1:3]]
        y = _labels(n_per_class=n // 10 + 1)[:n]
        assert partition_counts(y, parts, 10).tolist() == partition_counts(y, list(expected), 10).tolist()
    with pytest.raises(IndexError):
        iid_partition(103, 10, seed=0)[10]


@pytest.mark.parametrize(
    ("flat", "offsets"),
    [([0, 1, 2], [0, 2]), ([0, 1], [1, 2]), ([0, 1, 2], [0, 2, 1, 3]), ([[0, 1]], [0, 2]), ([0], [])],
)
def test_parts_whose_offsets_do_not_cover_the_array_are_refused(flat, offsets) -> None:
    with pytest.raises(ValueError, match="offsets"):
        Parts(np.asarray(flat), np.asarray(offsets))


def test_parts_of_arrays_and_back() -> None:
    arrays = [np.array([5, 1]), np.array([], dtype=np.int64), np.array([7])]
    parts = Parts.of(arrays)
    assert parts.offsets.tolist() == [0, 2, 2, 3] and parts.owners().tolist() == [0, 0, 2]
    assert [p.tolist() for p in parts] == [[5, 1], [], [7]] and Parts.of(parts) is parts
    assert sizes_of(arrays).tolist() == sizes_of(parts).tolist() == [2, 0, 1]
    assert len(Parts.of([])) == 0


def test_positions_find_a_party_by_id_dense_or_not() -> None:
    """The id is the row where the parties are 0..n-1; other ids (a silo's, in any order) by search."""
    dense, sparse = Positions(range(4)), Positions([9, 3, 7])
    assert dense.dense and [dense.row(p) for p in (0, 3, 4, -1, "x")] == [0, 3, None, None, None]
    assert not sparse.dense and [sparse.row(p) for p in (9, 3, 7, 8, 0)] == [0, 1, 2, None, None]
    sizes = Sizes([9, 3, 7], np.array([1, 2, 3]))
    assert dict(sizes) == {9: 1, 3: 2, 7: 3} and 8 not in sizes and sizes.get(8) is None
    with pytest.raises(ValueError, match="distinct"):
        Positions([1, 1])


def test_shard_partition_classes_and_cover() -> None:
    y = _labels(n_per_class=53)
    parts, party_classes = shard_partition(y, n_parties=10, shards_per_party=2, seed=0)
    assert party_classes.shape == (10, 2)
    np.testing.assert_array_equal(np.bincount(party_classes.ravel(), minlength=10), np.full(10, 2))
    _assert_exact_cover(parts, len(y))
    counts = partition_counts(y, parts, 10)
    for j, part in enumerate(parts):
        assert set(np.unique(y[part]).tolist()) <= set(party_classes[j].tolist())
        for c in range(10):
            shards = int((party_classes[j] == c).sum())
            assert 26 * shards <= counts[j, c] <= 27 * shards


def test_shard_partition_seed_and_errors() -> None:
    y = _labels(n_per_class=20)
    a, ca = shard_partition(y, 10, 2, seed=4)
    b, cb = shard_partition(y, 10, 2, seed=4)
    np.testing.assert_array_equal(ca, cb)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(PartitionError, match="multiple of the number of classes"):
        shard_partition(y, n_parties=3, shards_per_party=3, seed=0)
    with pytest.raises(PartitionError, match="fewer than"):
        shard_partition(y, n_parties=50, shards_per_party=6, seed=0)


def test_class_matched_partition_matches_train_classes() -> None:
    y_train, y_test = _labels(60, seed=1), _labels(20, seed=2)
    train_parts, party_classes = shard_partition(y_train, 20, 2, seed=5)
    test_parts = class_matched_partition(y_test, party_classes, seed=5)
    _assert_exact_cover(test_parts, len(y_test))
    for j in range(20):
        train_classes = set(np.unique(y_train[train_parts[j]]).tolist())
        assert set(np.unique(y_test[test_parts[j]]).tolist()) == train_classes
        assert train_classes == set(party_classes[j].tolist())


def test_class_matched_partition_drops_unused_classes() -> None:
    y = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    parts = class_matched_partition(y, np.array([[2], [2], [0]]), seed=0)
    assert [sorted(y[p].tolist()) for p in parts] == [[2, 2], [2, 2], [0, 0]]


def test_partition_counts_and_table(tmp_path) -> None:
    y = np.array([0, 1, 1, 2, 2, 2])
    counts = partition_counts(y, [np.array([0, 1]), np.array([2, 3, 4, 5])], 3)
    np.testing.assert_array_equal(counts, [[1, 1, 0], [0, 1, 3]])
    table = format_partition_table(counts).splitlines()
    assert table[0].split() == ["party", "c0", "c1", "c2", "total"]
    assert table[1].split() == ["0", "1", "1", "0", "2"]
    assert table[2].split() == ["1", "0", "1", "3", "4"]
    assert table[3].split() == ["all", "1", "2", "3", "6"]
    with pytest.raises(ValueError):
        partition_counts(y, [np.array([5])], 2)
    out = save_partition_heatmap(counts, tmp_path / "fig" / "heat.png", "toy")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
