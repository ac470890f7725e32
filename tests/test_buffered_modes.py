"""Buffered aggregation in the distributed modes, over real processes (the MPI simulation's server and
workers under mpirun, a gRPC server and its silos on 127.0.0.1: what is tested is their messages):
the MPI simulation takes the updates in the simulated clock's order and ends with the standalone
run's model and records; a gRPC run aggregates at the parties' real pace, a silo that dies
holding a task stalls no buffer (its task is dropped and other parties take the slot), and a server
killed with SIGKILL and started again with --resume, its silos left running, ends with a run whose
records replay to its model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.conformance import recovery
from tests.support.bn_cnn import REF as BN_NETWORK
from tests.support.buffered_runs import run_records, standalone_and_mpi
from tests.support.cli import restored_main
from tests.support.marks import SLOW_WITH_DATA
from tests.support.processes import grpc_command, start_rank

pytestmark = SLOW_WITH_DATA

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "fashion_mnist" / "moon.yaml"
BUFFERED = ["server_args.aggregation=buffered", "server_args.buffer_size=2"]


def _standalone_and_mpi(config: Path, sets: list[str], tmp_path: Path) -> tuple[list[dict], list[dict]]:
    """A 4-round buffered run standalone and in the MPI simulation (`standalone_and_mpi`: the same
    final model and metrics), every record's updates and simulated second, some update stale;
    (standalone's, MPI's) records."""
    want, got = standalone_and_mpi(config, sets, tmp_path)
    assert [(r["updates"], r["sim_time_s"]) for r in got] == [(r["updates"], r["sim_time_s"]) for r in want]
    assert len(got) == 4 and any(r["staleness_max"] > 0 for r in got)
    return want, got


EVALUATED = {  # the parties report on evaluation rounds (distributed.server.buffered_eval)
    "moon-local-test": (CONFIG, ["validation_args.local_test=true"]),
    "lg-federated": (
        ROOT / "config" / "fashion_mnist" / "lg.yaml",
        [
            "validation_args.evaluation=federated",
            "algorithm_args.warmup_rounds=1",
            "train_args.client_num_in_total=5",
        ],
    ),
}


@pytest.mark.parametrize("case", list(EVALUATED))
def test_the_mpi_simulation_takes_updates_in_the_clocks_order(case, tmp_path):
    """4 parties (LG-FedAvg's shards: 5) at lognormal speeds, 3 training at once, K = 2 (a fast
    party may be in a buffer twice): the MPI simulation's workers answer in whatever real order, its
    server takes each update at its simulated instant; every record's updates and simulated second,
    the parties' reports on each evaluation round (MOON's local tests; LG-FedAvg's personalised
    models counted on the parties' test splits, then their new test), the updates left out
    (LG-FedAvg's warm-up tasks that arrive after the warm-up) and the final model (<= 1e-5: parties
    trained together or one by one) are the standalone run's."""
    config, evaluation = EVALUATED[case]
    sets = [
        *conformance.TINY,
        *BUFFERED,
        "train_args.client_num_in_total=4",
        "train_args.client_num_per_round=3",
        *evaluation,
    ]
    sets += ["train_args.party_speed=lognormal", "train_args.comm_round=4"]
    want, got = _standalone_and_mpi(config, sets, tmp_path)
    assert [r["left_out"] for r in got] == [
        r["left_out"] for r in want
    ]  # LG: warm-up tasks arriving after it
    assert case != "lg-federated" or any(why == "unusable" for r in got for _, _, why, _ in r["left_out"])
    reported = [k for k in ("local_test_acc", "new_test_acc", "test_acc") if k in want[-1]]
    assert reported[0] != "test_acc", f"no party reported: {sorted(want[-1])}"
    for key in reported:  # every evaluated round's figure, to float rounding
        assert [r.get(key) for r in got] == pytest.approx([r.get(key) for r in want], abs=1e-4), key


SECURE_BUFFERS = [  # secure buffers of K = 3 among 4 parties at lognormal speeds, all training at once
    *conformance.TINY,
    "server_args.aggregation=buffered",
    "server_args.buffer_size=3",
    "train_args.client_num_in_total=4",
    "train_args.client_num_per_round=4",
    "privacy_args.secure_aggregation=true",
    "validation_args.local_test=false",
    "train_args.party_speed=lognormal",
    "train_args.comm_round=4",
]


def test_the_mpi_simulation_sums_each_buffer_securely_to_the_standalone_model(tmp_path):
    """Secure aggregation (distributed.server.buffered_secure): 4 parties at lognormal speeds, all training
    at once, K = 3, federated evaluation every other round (the parties' test counts in a secure sum
    of their own). The MPI simulation's silos hold their uploads, each buffer is a secure sum among
    its parties over MPI, and the run ends with the standalone run's model, its updates and simulated
    seconds in every record, and its test figures (the decoded sums do not depend on the masks)."""
    sets = [
        *SECURE_BUFFERS,
        "validation_args.evaluation=federated",
        "validation_args.frequency_of_the_test=2",
    ]
    want, got = _standalone_and_mpi(CONFIG, sets, tmp_path)
    assert [r.get("test_acc") for r in got] == pytest.approx([r.get("test_acc") for r in want], abs=1e-4)
    assert [r["round"] for r in got if "test_acc" in r] == [0, 2, 3]


def test_a_batchnorm_network_buffers_securely_in_the_mpi_simulation_as_standalone(tmp_path):
    """A BatchNorm network (tests/support/bn_cnn.py), secure buffers of K = 3 among 4 parties at
    lognormal speeds: the silos sum their statistics' changes from the stale models they were sent,
    the server restates them against its current model (engine.buffer_rounds), and the MPI
    simulation ends with the standalone run's model, every variance >= 0."""
    sets = [*SECURE_BUFFERS, f"model_args.model={BN_NETWORK}"]
    _standalone_and_mpi(CONFIG, sets, tmp_path)
    final = torch.load(tmp_path / "standalone" / "final_model.pt", weights_only=True)
    variances = [v for k, v in final.items() if k.endswith("running_var")]
    assert variances and all(bool((v >= 0).all()) for v in variances)


def test_a_grpc_run_at_the_parties_pace_replays_to_its_model(tmp_path):
    """gRPC, 3 silos of one party each, all training at once, K = 2: the server takes updates as they
    arrive (some stale), the silos report their parties' local tests every other round and on the
    last, and `fedml-moon replay` of its records, in one process, ends with its model (<= 1e-5) and
    the same updates in each buffer."""
    sets = [*conformance.TINY, *BUFFERED, "train_args.client_num_per_round=3", "train_args.comm_round=4"]
    sets += ["validation_args.local_test=true", "validation_args.frequency_of_the_test=2"]
    run = conformance.run_mode("cross-silo-grpc", CONFIG, sets, tmp_path, timeout_s=180)
    assert run.ok, run.tail()
    records = run_records(run.out_dir)
    assert len(records) == 4 and any(r["staleness_max"] > 0 for r in records)
    assert [r["round"] for r in records if "local_test_acc" in r] == [0, 2, 3]  # the silos' reports
    with restored_main() as main:
        assert main(["replay", str(run.out_dir)]) == 0
    assert [r["updates"] for r in run_records(run.out_dir / "replay")] == [r["updates"] for r in records]


def test_a_silo_dead_with_a_task_stalls_no_buffer(tmp_path):
    """gRPC, 2 silos of one party each, one party training at a time, K = 1: silo 2 (party 1) dies
    when its first task arrives. The run can go on only once that task is dropped: its heartbeats
    stop, the server drops the task and gives the slot to party 0; the run completes, every buffer
    party 0's update."""
    extra = [*BUFFERED, "server_args.buffer_size=1", "train_args.comm_round=3", "comm_args.heartbeat_s=1"]
    seed = "common_args.random_seed=1"  # its first draw gives the one slot to party 1
    cmd, out = grpc_command(tmp_path, 2, *extra, "train_args.client_num_per_round=1", seed)
    server, log = start_rank(cmd, 0, tmp_path)
    own = [sys.executable, str(ROOT / "tests" / "support" / "dying_silo.py"), "train", *cmd[3:]]
    procs = [server] + [start_rank(own if r == 2 else cmd, r, tmp_path)[0] for r in (1, 2)]
    try:
        codes = conformance.wait_all(procs, 240)
    finally:
        for proc in procs:
            conformance.stop(proc)
    text = log.read_text(errors="replace")
    assert codes == [0, 0, 9], f"{codes}\n{text[-3000:]}"
    assert "dropped the tasks of parties [1]" in text, text[-3000:]
    records = run_records(out)
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert [r["updates"] for r in records] == [[[0, 0]], [[0, 1]], [[0, 2]]]


def test_a_grpc_server_killed_and_resumed_ends_with_a_run_its_records_replay(tmp_path):
    """gRPC, 3 silos of one party each, all training at once, K = 2, a checkpoint every 2 rounds: the
    server is killed with SIGKILL after 3 rounds and started again with --resume 4 s later, the silos
    untouched (they restore their parties from the checkpoint). The run completes; its records name
    each update once as kept or left out, and `fedml-moon replay` ends with its model (<= 1e-5)."""
    run = [
        *conformance.TINY,
        *BUFFERED,
        "train_args.client_num_per_round=3",
        "train_args.comm_round=8",
        "train_args.checkpoint_every=2",
    ]
    port = conformance.free_port()
    local = ["common_args.training_type=cross_silo", "comm_args.backend=GRPC", "comm_args.heartbeat_s=1"]
    local += ["device_args.torch_threads=1", "tracking_args.enable_wandb=false"]
    local.append(f"comm_args.grpc_ipconfig_path={conformance.write_ipconfig(tmp_path / 'ip.csv', 1, port)}")
    drill = recovery.server_restart(tmp_path, CONFIG, run, local, after_rounds=3)
    assert drill.returncodes == [0, 0, 0, 0], {k: v[-2500:] for k, v in drill.logs.items()}
    assert "resuming after the checkpoint of round" in drill.logs["server-2.log"]
    assert all(
        "resumed its parties from the checkpoint of round" in drill.logs[f"silo-{r}.log"] for r in (1, 2, 3)
    )
    records = run_records(drill.out_dir)
    assert len(records) == 8 and [r["round"] for r in records] == list(range(8))
    with restored_main() as main:
        assert main(["replay", str(drill.out_dir)]) == 0
    assert [r["updates"] for r in run_records(drill.out_dir / "replay")] == [r["updates"] for r in records]
