"""TensorBoard beside W&B (`tracking_args.tensorboard`): the event files hold metrics.jsonl's numbers,
one step a round, as TensorBoard's own reader reads them; a resumed run's curves go on from its
checkpoint, the rounds an interrupted run wrote past it purged; the run says how to get the package
when it is missing. The runs in every mode: tests/test_resume.py (standalone and the MPI simulation,
killed and resumed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.records.recorder import RunRecorder
from fedml_moon.records.tracking import TensorBoardRun, scalars
from tests.support.records import assert_curves_are_the_records, curves

ROOT = Path(__file__).resolve().parent.parent


def _record(round_idx: int, acc: float) -> dict:
    return {
        "round": round_idx,
        "test_acc": acc,
        "test_loss": 2.0 - acc,
        "round_time_s": 0.25,
        "algorithm": "moon",
        "party_test": {"0": acc / 2, "3": acc / 3},
        "parties": [0, 3],
        "secure": True,
    }


def test_scalars_are_a_records_numbers_and_nested_numbers_under_their_field():
    assert scalars(_record(4, 0.5)) == {
        "test_acc": 0.5,
        "test_loss": 1.5,
        "round_time_s": 0.25,
        "party_test/0": 0.25,
        "party_test/3": pytest.approx(0.5 / 3),
    }


def test_a_resumed_run_continues_its_curves_and_drops_what_was_written_past_its_checkpoint(tmp_path):
    first = RunRecorder(tmp_path, {}, tensorboard=TensorBoardRun(tmp_path))
    for r in range(4):  # the interrupted run: its checkpoint holds rounds 0 and 1
        first.log_round(_record(r, 0.1 * (r + 1)))
    first.tensorboard.finish()
    assert [s for s, _ in curves(tmp_path)["test_acc"]] == [0, 1, 2, 3]

    again = RunRecorder(tmp_path, {}, tensorboard=TensorBoardRun(tmp_path))
    again.restore(first.records[:2])
    for r in (2, 3, 4):  # computed again, to other values, and one round more
        again.log_round(_record(r, 0.5 + 0.1 * r))
    again.finish("completed")
    assert_curves_are_the_records(tmp_path)
    assert [round(v, 5) for _, v in curves(tmp_path)["test_acc"]] == [0.1, 0.2, 0.7, 0.8, 0.9]


def test_a_run_resumed_from_before_its_first_record_starts_its_curves_over(tmp_path):
    first = RunRecorder(tmp_path, {}, tensorboard=TensorBoardRun(tmp_path))
    first.log_round(_record(0, 0.3))
    first.tensorboard.finish()
    again = RunRecorder(tmp_path, {}, tensorboard=TensorBoardRun(tmp_path))
    again.restore([])
    again.log_round(_record(0, 0.6))
    again.finish("completed")
    assert curves(tmp_path)["test_acc"] == [(0, pytest.approx(0.6))]


def test_without_the_package_the_run_says_how_to_get_it_before_it_records_anything(tmp_path, monkeypatch):
    import importlib.util

    from fedml_moon.adapters import run

    cfg = load_config(ROOT / "config" / "fashion_mnist" / "moon.yaml", ["tracking_args.tensorboard=true"])
    real = importlib.util.find_spec  # as where the package is not installed:

    def find_spec(name: str, *args):
        return None if name == "tensorboard" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    said = r"tracking_args.tensorboard.*pip install 'fedml-moon\[tensorboard\]"
    with pytest.raises(ConfigError, match=said):
        run._tensorboard(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert run._tensorboard(load_config(ROOT / "config" / "fashion_mnist" / "moon.yaml"), tmp_path) is None
