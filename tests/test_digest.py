"""The model digest (summary.json's final_model_sha256): the same parameters give the same digest,
whatever their memory layout or insertion order; any change of a value, a name, a dtype or a shape
gives another."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from fedml_moon.core.digest import state_dict_sha256


def _state() -> OrderedDict:
    g = torch.Generator().manual_seed(0)
    return OrderedDict(
        w=torch.randn(4, 3, generator=g),
        b=torch.randn(4, generator=g),
        steps=torch.tensor(7),
        mask=torch.tensor([True, False]),
    )


def test_equal_state_dicts_have_equal_digests():
    a, b = _state(), _state()
    assert state_dict_sha256(a) == state_dict_sha256(b)
    assert len(state_dict_sha256(a)) == 64
    shuffled = OrderedDict((k, b[k]) for k in reversed(list(b)))
    assert state_dict_sha256(shuffled) == state_dict_sha256(a)  # sorted key order
    b["w"] = b["w"].t().contiguous().t()  # the same values in another memory layout
    assert not b["w"].is_contiguous() and state_dict_sha256(b) == state_dict_sha256(a)


def test_any_change_gives_another_digest():
    ref = state_dict_sha256(_state())
    changed = _state()
    changed["w"][2, 1] += 1e-6  # one element
    assert state_dict_sha256(changed) != ref
    renamed = _state()
    renamed["bias"] = renamed.pop("b")
    assert state_dict_sha256(renamed) != ref
    retyped = _state()
    retyped["w"] = retyped["w"].double()
    assert state_dict_sha256(retyped) != ref
    retyped = _state()
    retyped["steps"] = retyped["steps"].int()  # the same number, 4 bytes instead of 8
    assert state_dict_sha256(retyped) != ref
    reshaped = _state()
    reshaped["w"] = reshaped["w"].reshape(3, 4)  # the same bytes, another shape
    assert state_dict_sha256(reshaped) != ref
    fewer = _state()
    del fewer["mask"]
    assert state_dict_sha256(fewer) != ref


def test_a_digest_is_of_tensors_only():
    with pytest.raises(TypeError, match="'lr' is a float"):
        state_dict_sha256({"lr": 0.1})
