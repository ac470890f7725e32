"""Every party's claim as columns (`engine.claim_table`): the same mapping the per-party dicts were,
checkpointed as tensors, and an older checkpoint's per-party claims still load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedml_moon.core.codec import decode, encode
from fedml_moon.engine.claim_table import ClaimTable, Rows
from fedml_moon.engine.claims import loaded_claims, saved_claims

COUNTS = np.array([[5, 0, 12], [0, 0, 3], [20, 11, 0]])


def _as_dicts(parties, samples, tests, counts, threshold) -> dict[int, dict]:
    """What the server held before the table: a dict per party (`claims_of` of earlier versions)."""
    out = {}
    for p, n, m, row in zip(parties, samples, tests, counts, strict=True):
        held = [] if threshold is None else [c for c, k in enumerate(row) if k > threshold]
        out[int(p)] = {"samples": int(n), "test_samples": int(m), "classes": held}
    return out


@pytest.mark.parametrize("threshold", [None, 0, 10])
@pytest.mark.parametrize("parties", [[0, 1, 2], [7, 2, 40]])
def test_the_table_is_the_mapping_the_dicts_were(parties, threshold):
    samples, tests = COUNTS.sum(1), [4, 5, 6]
    table = ClaimTable.of(parties, samples, tests, COUNTS, threshold)
    dicts = _as_dicts(parties, samples, tests, COUNTS, threshold)
    assert table == dicts and dict(table) == dicts and list(table) == sorted(dicts)
    assert all(
        type(v) is int for c in table.values() for v in (c["samples"], c["test_samples"], *c["classes"])
    )
    for name in ("samples", "test_samples", "classes"):
        assert dict(table.column(name)) == {p: c[name] for p, c in dicts.items()}
    missing = max(parties) + 1
    assert (
        missing not in table and table.get(missing) is None and table.column("samples").get(missing) is None
    )
    with pytest.raises(KeyError):
        table[missing]
    assert dict(Rows(parties, COUNTS)) == {p: row.tolist() for p, row in zip(parties, COUNTS, strict=True)}


@pytest.mark.parametrize("threshold", [None, 10])
def test_a_checkpoint_holds_the_columns_and_gives_back_the_same_claims(threshold):
    table = ClaimTable.of([0, 1, 2], COUNTS.sum(1), [4, 5, 6], COUNTS, threshold)
    saved = saved_claims(table)
    assert set(saved) == {"table"} and isinstance(saved["table"]["samples"], torch.Tensor)
    back = loaded_claims(decode(encode({"claims": saved}))["claims"])
    assert isinstance(back, ClaimTable) and back == table and dict(back) == dict(table)
    other = ClaimTable.of([0, 1, 2], COUNTS.sum(1), [4, 5, 7], COUNTS, threshold)
    assert back != other  # one party's test samples differ: resume refuses it


def test_an_older_checkpoints_claims_load_and_compare_with_the_table():
    """Before the table a checkpoint held a dict per party keyed by its id as a string."""
    table = ClaimTable.of([0, 1, 2], COUNTS.sum(1), [4, 5, 6], COUNTS, 10)
    older = {str(p): c for p, c in _as_dicts([0, 1, 2], COUNTS.sum(1), [4, 5, 6], COUNTS, 10).items()}
    assert saved_claims(dict(table)) == older
    back = decode(encode({"claims": older}))["claims"]
    assert loaded_claims(back) == table and loaded_claims(None) == {} and loaded_claims({}) == {}


@pytest.mark.parametrize(
    "state",
    [
        {"parties": torch.arange(3), "samples": torch.ones(3, dtype=torch.long)},
        {"parties": [0, 1], "samples": torch.ones(2), "test_samples": torch.ones(2), "classes": None},
        {
            "parties": torch.arange(2),
            "samples": torch.ones(2),
            "test_samples": torch.ones(3),
            "classes": None,
        },
        {"parties": torch.tensor([1, 1]), "samples": torch.ones(2), "test_samples": torch.ones(2)},
        {"parties": torch.arange(2), "samples": torch.ones(2), "test_samples": torch.ones(2), "classes": 3},
    ],
)
def test_a_checkpoint_table_whose_columns_do_not_fit_is_refused(state):
    with pytest.raises(ValueError):
        loaded_claims({"table": state})
