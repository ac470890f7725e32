"""What a DP run releases, to whom, and what its epsilons cover, from real runs (in this process, tiny):
every field a DP run writes to `metrics.jsonl` or `summary.json` has a row in the privacy page's table
of released values; `summary.json` states the run's guarantee (`dp_scope`) and both epsilons, the one
with the sample known never below the one with it secret; the status port serves each epsilon
labelled by its observer, and the status text, the page and `fedml-moon report` show them with what
they do not cover."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.conformance.inprocess import quiet_run
from fedml_moon.results.report import write_report
from fedml_moon.status import record as run_status
from fedml_moon.status.app import StatusApp
from tests.support.marks import needs_fmnist

pytestmark = needs_fmnist
ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "config" / "fashion_mnist"
DP = [
    "privacy_args.dp_clip_norm=1.0",
    "privacy_args.dp_noise_multiplier=0.1",
    "train_args.learning_rate=0.01",
]
SECURE = ["privacy_args.secure_aggregation=true", "validation_args.local_test=false"]
RUNS = {  # name: (config, settings beside TINY and DP)
    "fedavg-dp": ("fedavg.yaml", []),
    "moon-dp-secure": ("moon.yaml", [*SECURE, "train_args.client_num_in_total=4", "train_args.client_num_per_round=3"]),  # noqa: E501
    "lg-dp": ("lg.yaml", ["algorithm_args.warmup_rounds=1", "train_args.client_num_in_total=5", "algorithm_args.report_best=true"]),  # noqa: E501
    "fedavg-dp-buffered": ("fedavg.yaml", ["server_args.aggregation=buffered", "server_args.buffer_size=2"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dp-runs")
    out = {}
    for name, (config, sets) in RUNS.items():
        with quiet_run(CONFIGS / config, [*conformance.TINY, *DP, *sets], root / name) as run:
            run.loop.run()
        out[name] = root / name
    return out


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _table_names() -> list[str]:
    """The names in the first column of the privacy page's table of released values."""
    page = (ROOT / "docs" / "explanation" / "privacy.md").read_text()
    table = page.split("## Every released value, and who sees it")[1]
    rows = [
        line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| released")
    ]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])]


def _has_row(field: str, names: list[str]) -> bool:
    return any(field == n or ("*" in n and re.fullmatch(n.replace("*", ".*"), field)) for n in names)


def test_every_field_a_dp_run_writes_has_a_row_in_the_privacy_pages_table(runs):
    names = _table_names()
    written = set()
    for folder in runs.values():
        written |= {k for r in _records(folder) for k in r} | set(
            json.loads((folder / "summary.json").read_text())
        )
    written -= {"round"}  # the record's index
    missing = sorted(f for f in written if not _has_row(f, names))
    assert not missing, f"fields a DP run writes that the privacy page's table does not name: {missing}"
    assert {"dp_epsilon_release", "dp_scope", "new_test_acc", "updates", "reported_new_test_acc"} <= written


def test_summary_states_the_guarantee_and_both_epsilons(runs):
    for name, folder in runs.items():
        summary = json.loads((folder / "summary.json").read_text())
        scope = summary["dp_scope"]
        assert set(scope) == {"unit", "adjacency", "released", "accountant", "epsilon_against", "not_covered"}
        assert summary["dp_epsilon_sample_known"] >= summary["dp_epsilon_release"] > 0, name
        assert "every site" in scope["epsilon_against"]["dp_epsilon_sample_known"]
        assert ("its own parties' noise shares" in scope["epsilon_against"]["dp_epsilon_sample_known"]) == (
            name.endswith("secure")
        )
        secure = name.endswith("secure")
        if secure:
            assert summary["dp_epsilon_server"] == summary["dp_epsilon_sample_known"]
        else:
            assert summary["dp_epsilon_server"] is None
            assert "sees every upload" in scope["epsilon_against"]["dp_epsilon_server"]
        assert any("training metrics" in line for line in scope["not_covered"])
    lg = json.loads((runs["lg-dp"] / "summary.json").read_text())["dp_scope"]["not_covered"]
    assert any("local layers" in line for line in lg)
    buffered = json.loads((runs["fedavg-dp-buffered"] / "summary.json").read_text())
    assert "no amplification is claimed" in buffered["dp_scope"]["epsilon_against"]["dp_epsilon_release"]


def test_the_status_serves_each_epsilon_labelled_by_its_observer(runs):
    from prometheus_client.parser import text_string_to_metric_families

    for name in ("fedavg-dp", "moon-dp-secure"):
        folder = runs[name]
        last = _records(folder)[-1]
        app = StatusApp(folder, {})
        body = app.answer("/metrics", "operator")[2].decode()
        served = {
            s.labels["against"]: s.value
            for f in text_string_to_metric_families(body)
            for s in f.samples
            if s.name == "fedml_moon_dp_epsilon"
        }
        want = {"release": last["dp_epsilon_release"], "sample_known": last["dp_epsilon_sample_known"]}
        if name.endswith("secure"):
            want["server"] = last["dp_epsilon_server"]
        assert served == pytest.approx(want)
        text = run_status.render(run_status.read(folder))
        assert (
            f"DP epsilon_sample_known {last['dp_epsilon_sample_known']:.2f}: against anyone who knows" in text
        )
        assert "not covered by epsilon: the round's training metrics" in text
        page = app.answer("/", "silo-1")[2].decode()  # a site sees the epsilons and what they leave out
        assert "DP epsilon_release" in page and "not covered by epsilon" in page


def test_the_report_shows_both_epsilons_and_the_scope(runs, tmp_path):
    out = write_report([runs["fedavg-dp"].parent], tmp_path / "report", None)
    text = (out / "report.md").read_text()
    assert "epsilon (sample secret / known)" in text
    assert "What the epsilon covers (summary.json's dp_scope)" in text and "- not covered:" in text
