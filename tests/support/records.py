"""What TensorBoard shows of a run's folder, read back as TensorBoard reads it, against the run's
records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedml_moon.records.tracking import scalars
from fedml_moon.run_folder import TENSORBOARD


def curves(out_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each scalar's (step, value) pairs as TensorBoard shows them (its EventAccumulator, which
    applies a resumed writer's purge)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out_dir / TENSORBOARD))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_curves_are_the_records(out_dir: Path) -> None:
    """Every number of every metrics.jsonl record is its tag's value at its round (float32, as
    TensorBoard stores a scalar), and nothing else is there."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    want: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for tag, value in scalars(record).items():
            want.setdefault(tag, []).append((record["round"], float(np.float32(value))))
    got = curves(out_dir)
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for tag in want:
        assert got[tag] == want[tag], tag
