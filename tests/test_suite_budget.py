"""benchmarks/suite_budget.py: the mode of each command the suite starts, and its report of a run."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("suite_budget", ROOT / "benchmarks" / "suite_budget.py")
budget = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(budget)
PY = "/x/.venv/bin/python"


@pytest.mark.parametrize(
    ("command", "mode"),
    [
        (f"{PY} -m fedml_moon simulate --cf config/fashion_mnist/moon.yaml", "standalone"),
        (f"/usr/bin/mpirun --oversubscribe -np 3 {PY} -m fedml_moon simulate --cf a.yaml", "mpi-simulation"),
        ("bash run/mpirun.sh 3 simulate --cf config/modes/moon_mpi_simulation.yaml", "mpi-simulation"),
        ("bash run/mpirun.sh run --cf config/modes/moon_cross_silo_mpi.yaml", "cross-silo-mpi"),
        (f"{PY} -m fedml_moon run --cf a.yaml --set comm_args.backend=GRPC --rank 1", "cross-silo-grpc"),
        (f"{PY} -m fedml_moon run --cf config/modes/moon_cross_silo_grpc.yaml --rank 0", "cross-silo-grpc"),
        ("bash run/run_client.sh 2 --set comm_args.tls=on", "cross-silo-grpc"),
        (f"{PY} -m fedml_moon run --cf config/modes/moon_edge_mqtt_s3.yaml --rank 1", "mqtt-s3"),
        (
            f"{PY} -m fedml_moon run --set comm_args.backend=GRPC --set comm_args.backend=MQTT_S3",
            "mqtt-s3",
        ),
        (f"{PY} .venv/bin/torchrun --nnodes 1 -m fedml_moon run --cf x.yaml", "torchrun"),
        ("bash run/setup.sh", None),
        (f"{PY} -m pip freeze", None),
        (f"{PY} -m fedml_moon sweep a.yaml --list", None),
    ],
)
def test_each_started_command_is_put_in_its_mode(command, mode):
    assert budget.mode_of(command) == mode


def test_the_report_counts_time_files_and_the_tests_of_each_mode(tmp_path, caplog):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest" tests="3" time="600.0">'
        '<testcase classname="tests.test_a" name="test_one" time="300.0"/>'
        '<testcase classname="tests.test_a" name="test_two" time="150.0"/>'
        '<testcase classname="tests.test_b" name="test_three" time="100.0"/>'
        "</testsuite></testsuites>"
    )
    processes = tmp_path / "processes"
    processes.mkdir()
    grpc = f"subprocess.Popen {PY} -m fedml_moon run --cf a.yaml --set comm_args.backend=GRPC"
    records = [
        {
            "test": "tests/test_a.py::test_one",
            "started": [grpc, grpc, "fedml_moon.fork " + grpc.split(" ", 1)[1]],
        },
        {"test": "tests/test_b.py::test_three", "started": ["subprocess.Popen bash run/setup.sh"]},
    ]
    (processes / "gw0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with caplog.at_level(logging.INFO, logger="suite_budget"):
        assert budget.main(["--junit", str(junit), "--processes", str(processes), "--top", "2"]) == 0
    text = caplog.text
    assert "pytest: 3 tests, 10.0 minutes (budget 20: 0.50 of it)" in text
    assert "300.0 s  tests.test_a::test_one" in text and "test_three" not in text.split("each file")[0]
    assert " 81.8 %    450.0 s  tests.test_a" in text and " 18.2 %    100.0 s  tests.test_b" in text
    assert (
        "tests that start processes: 2;" in text and "cross-silo-grpc=1 " in text and "standalone=0" in text
    )
