"""`train_args.stream_uploads`: each chunk of a round's uploads is folded into running float64 sums
as soon as it is trained (the server algorithm's `aggregate_sums`, as under privacy), so the server
holds one chunk's uploads, not the round's. The result is the held round's to float rounding, the
record's figures are the same, and what needs every upload at once is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.tiny import SUMMING, TINY_RUN

CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"
TINY = [*conformance.TINY, *TINY_RUN, "train_args.comm_round=2", "validation_args.local_test=false"]
STREAM = ["train_args.stream_uploads=true"]
CASES = {  # name: (config, overrides); 2 of 3 parties sampled per round. Each kind of sum once:
    "fedavgm": SUMMING["fedavgm"],  # the mean update, then the server's own step
    "moon-chunks-of-2": ("moon", ["train_args.parties_in_parallel=2"]),  # folded a chunk at a time
    "scaffold": SUMMING["scaffold"],  # a "sum" field beside the update
    "fedssc": SUMMING["fedssc"],  # prototype sums and class counts
    "lg-after-warm-up": ("lg", ["algorithm_args.warmup_rounds=1", "data_args.partition_method=hetero"]),
}


def _run(tmp_path: Path, name: str, overrides: list[str], monkeypatch) -> tuple[dict, list[dict]]:
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)
    assemble(load_config(CONFIGS / f"{name}.yaml", overrides), tmp_path).loop.run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return torch.load(tmp_path / "final_model.pt", weights_only=True), records


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
@pytest.mark.parametrize("case", list(CASES))
def test_a_streamed_round_ends_where_the_held_round_does(case, tmp_path, monkeypatch):
    """Two rounds: the final model within 1e-6 (the sums are float64, the held mean float32), and the
    record's training loss, bytes and parties equal."""
    name, extra = CASES[case]
    held, held_records = _run(tmp_path / "held", name, [*TINY, *extra], monkeypatch)
    streamed, records = _run(tmp_path / "streamed", name, [*TINY, *extra, *STREAM], monkeypatch)
    assert held.keys() == streamed.keys()
    far = max(float((held[k].double() - streamed[k].double()).abs().max()) for k in held)
    assert far <= 1e-6, far
    for a, b in zip(held_records, records, strict=True):
        for key in ("parties", "bytes_up", "params_up", "bytes_down"):
            assert a[key] == b[key], key
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12)


@pytest.mark.parametrize(
    ("config", "sets", "key"),
    [
        ("moon", ["comm_args.backend=MPI"], "comm_args.backend"),
        ("moon", ["server_args.robust_aggregation=median"], "server_args.robust_aggregation"),
        ("moon", ["train_args.save_party_models=true"], "train_args.save_party_models"),
        ("moon", ["privacy_args.secure_aggregation=true"], "privacy_args"),
        ("solo", [], "train_args.algorithm"),
    ],
)
def test_what_needs_every_upload_at_once_is_refused_naming_it(config, sets, key):
    with pytest.raises(ConfigError, match=f"train_args.stream_uploads: cannot stream with this {key}"):
        load_config(CONFIGS / f"{config}.yaml", [*STREAM, *sets])
