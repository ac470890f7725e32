"""Cross-silo on the sites' own data, with a server that holds none, as an operator runs it
(127.0.0.1, real processes): three sites, each its own folder of PNGs written from Fashion-MNIST
with its own class mix; the server's data_cache_dir an empty folder. Over gRPC with mutual TLS and
over MQTT + S3 the server is killed with SIGKILL mid-run and started again with --resume (over MQTT
+ S3 a site with it, which rejoins with its claims); over MPI each rank is given its own folder, and
the job is killed and run again with --resume (silos left running say once that they wait for the
server, and take the run's settings from it). Every run ends on the model of the standalone run of
the same holdings as per-party folders, with the same test_acc: the final model tested by hand on
the union of the sites' test splits. Parquet sites with the MLP, and secure aggregation of the
updates and the test counts, in runs of their own."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import build_base
from fedml_moon.config.load import load_config
from fedml_moon.conformance import recovery
from fedml_moon.core.evaluation import evaluate
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.security import make_certs
from tests.support.site_data import (
    CLASSES,
    MIXES,
    fashion,
    site_folders,
    site_sets,
    table_frame,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "fashion_mnist" / "moon.yaml"
RUN = [  # the run's settings: the server's only (a site takes them from it)
    *site_sets(),
    "data_args.dataset=imagefolder",
    "data_args.partition_method=natural",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=8",
    "train_args.batch_size=32",
    "train_args.checkpoint_every=2",
    "validation_args.frequency_of_the_test=2",
]
LOCAL = [
    "common_args.training_type=cross_silo",
    "comm_args.heartbeat_s=1",
    "comm_args.timeout_s=120",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]
EVALUATED = (
    "eval_bytes",
    "party_test",
    "test_samples",
    "test_loss",
    "_time_s",
    "wire_",
    "pooled_",
    "site_mean",
)


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    """Each site's folder with 60 training images a party (tests/conftest.py's have 40)."""
    return site_folders(tmp_path_factory, per_party=60)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sites) -> Path:
    """The same holdings as per-party folders in the standalone simulation (central evaluation)."""
    run = [
        *RUN,
        f"data_args.data_cache_dir={sites}",
        "device_args.torch_threads=1",
        "tracking_args.enable_wandb=false",
    ]
    ref = conformance.run_mode("standalone", CONFIG, run, tmp_path_factory.mktemp("reference"))
    assert ref.ok, ref.tail()
    return ref.out_dir


def _empty(tmp_path: Path) -> str:
    """The server's data folder: an empty one."""
    (tmp_path / "server-data").mkdir()
    return f"data_args.data_cache_dir={tmp_path / 'server-data'}"


def _server_run(tmp_path: Path) -> list[str]:
    return [*RUN, _empty(tmp_path)]


def _own(sites: Path, extra=lambda r: []) -> dict[int, list[str]]:
    return {
        r: [f"data_args.data_cache_dir={sites / name}", *extra(r)] for r, name in enumerate(sorted(MIXES), 1)
    }


def _records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not any(d in k for d in EVALUATED)} for x in lines]


def _assert_same_run(ref: Path, out: Path, sites: Path) -> None:
    a = torch.load(ref / "final_model.pt", weights_only=True)
    b = torch.load(out / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "another final model than the standalone run's"
    assert _records(ref) == _records(out)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    cfg = load_config(CONFIG, [*RUN, f"data_args.data_cache_dir={sites}"])
    base = build_base(cfg, out.parent / "by-hand")  # the union of the sites' test splits
    base.model.load_state_dict(b)
    acc, loss = evaluate(base.model, base.dataset.test_data_global, torch.device("cpu"))
    assert last["test_acc"] == acc and last["test_loss"] == pytest.approx(loss, rel=1e-6)
    assert set(last["party_test"]) == {"0", "1", "2"} and not (out / "partition.png").exists()
    silos = sorted(p.name for p in out.glob("rank-*") if p.is_dir())
    assert silos and silos == sorted(p.parent.name for p in out.glob("rank-*/partition.png"))  # its own party
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    _sites_hold_the_final_model(out)


def _sites_hold_the_final_model(out: Path) -> None:
    """Each site's folder holds the server's final model, bitwise, loadable without pickle's objects."""
    final = torch.load(out / "final_model.pt", weights_only=True)
    for r in (1, 2, 3):
        kept = torch.load(out / f"rank-{r}" / "final_model.pt", weights_only=True)
        assert kept.keys() == final.keys() and all(torch.equal(kept[k], final[k]) for k in final), r


def _sites_logged_their_results(out: Path, logs: dict[str, str]) -> None:
    """Each site logged its own test figures on every evaluated round, and the final model's SHA-256
    the server logged (of the final_model.pt it wrote) when it received it."""
    digest = json.loads((out / "summary.json").read_text())["final_model_sha256"]
    server = "".join(text for name, text in logs.items() if name.startswith("server"))
    assert f"final model sha256 {digest} (final_model.pt)" in server
    assert f"sending the final model (sha256 {digest}) to rank(s) [1, 2, 3]" in server
    evaluated = [r["round"] for r in _lines(out) if "test_acc" in r]
    for r in (1, 2, 3):
        said = "".join(text for name, text in logs.items() if name.startswith(f"silo-{r}"))
        assert f"rank {r}: final model sha256 {digest} ({out / f'rank-{r}' / 'final_model.pt'})" in said
        for k in evaluated:
            own = rf"rank {r}, round {k}, its own test \(parties \[{r - 1}\]\): test_acc [01]\.\d{{4}} "
            assert re.search(own + r"test_loss \d", said), (r, k)


def _drill(tmp_path: Path, run: list[str], local: list[str], own: dict, kill_silo: int | None = None) -> Path:
    drill = recovery.server_restart(tmp_path, CONFIG, run, [*LOCAL, *local], kill_silo, own=own)
    assert drill.returncodes == [0, 0, 0, 0], {k: v[-2500:] for k, v in drill.logs.items()}
    server = drill.logs["server-1.log"]
    assert "the server holds no training data; evaluation is federated" in server
    assert "resuming after the checkpoint of round" in drill.logs["server-2.log"]
    for r in (1, 2, 3):
        first = drill.logs[f"silo-{r}.log"]
        assert f"party {r - 1} ({sorted(MIXES)[r - 1]})" in first
        assert "takes" in first and "train_args.comm_round" in first  # from the server, not from --set
        if r != kill_silo:  # left running: it waited for the new server, said so once, and rejoined
            assert first.count("for a server to welcome it") == 1
            assert "resumed its parties from the checkpoint of round" in first
    if kill_silo is not None:  # the restarted site rejoined with its claims, as they were fixed
        assert "resumed its parties from the checkpoint" in drill.logs[f"silo-{kill_silo}-again.log"]
        assert "claims are refused" not in drill.logs["server-2.log"]
    _sites_logged_their_results(drill.out_dir, drill.logs)
    return drill.out_dir


def test_grpc_with_tls_server_killed_and_resumed(tmp_path, sites, reference):
    certs = tmp_path / "certs"
    make_certs(certs, 3, ["127.0.0.1"])
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 1, conformance.free_port())
    comm = ["comm_args.backend=GRPC", f"comm_args.grpc_ipconfig_path={ipconfig}", "comm_args.tls=on"]
    ca = f"comm_args.tls_ca={certs / 'ca.pem'}"
    server = [*_server_run(tmp_path), ca, f"comm_args.tls_cert={certs / 'server.pem'}",
              f"comm_args.tls_key={certs / 'server.key'}"]  # fmt: skip

    def silo_tls(r: int) -> list[str]:
        return [
            ca,
            f"comm_args.tls_cert={certs / f'silo-{r}.pem'}",
            f"comm_args.tls_key={certs / f'silo-{r}.key'}",
        ]

    out = _drill(tmp_path, server, comm, _own(sites, silo_tls))
    _assert_same_run(reference, out, sites)


def test_mqtt_s3_server_and_one_site_killed_and_restarted(tmp_path, sites, reference):
    with conformance.services(tmp_path / "services") as svc:
        comm = [
            "comm_args.backend=MQTT_S3",
            f"comm_args.run_id=own-{conformance.free_port()}",
            *svc.overrides,
        ]
        out = _drill(tmp_path, _server_run(tmp_path), comm, _own(sites), kill_silo=3)
    _assert_same_run(reference, out, sites)


def test_mpi_each_rank_its_own_folder_killed_and_resumed(tmp_path, sites, reference):
    """mpirun's app contexts give each rank its own --set (rank 0 the server, ranks 1..3 the sites:
    the run's settings and each its own data folder). The job is killed with SIGKILL after its first
    checkpoint and run again with --resume (mpirun has no survivors: every rank restarts)."""
    out, env = tmp_path / "run", conformance.process_env(tmp_path)
    comm = [*LOCAL, "comm_args.backend=MPI"]
    contexts = [conformance.cli_command("run", CONFIG, [*comm, *_server_run(tmp_path)], out)]
    mine = [*comm, *RUN]  # under mpirun every rank checks the run's settings before the server's WELCOME
    contexts += [conformance.cli_command("run", CONFIG, [*mine, *own], out) for own in _own(sites).values()]

    def job(*extra: str) -> list[str]:
        cmd = conformance.mpirun_command(1, [*contexts[0], *extra])
        for context in contexts[1:]:
            cmd += [":", "-np", "1", *context, *extra]
        return cmd

    first = conformance.spawn(job(), tmp_path / "mpi.log", env, tmp_path)
    try:
        recovery.wait_rounds(out, 3, 240)
        recovery.wait_checkpoint(out, 1, 240)
    finally:
        conformance.stop(first, first=signal.SIGKILL)
    assert not (out / "summary.json").exists(), "the run ended before it was killed"
    again = conformance.spawn(job("--resume", str(out)), tmp_path / "resume.log", env, tmp_path)
    codes = conformance.wait_all([again], 300)
    assert codes == [0], (tmp_path / "resume.log").read_text()[-3000:]
    assert "resuming after the checkpoint of round" in (tmp_path / "resume.log").read_text()
    _assert_same_run(reference, out, sites)


def _grpc_run(
    tmp_path: Path, sites: dict[int, list[str]], server: list[str], scripts: dict[int, str] | None = None
) -> Path:
    """A gRPC run on 127.0.0.1 (no TLS): each site with its own settings, site r run by
    tests/support/`scripts[r]` where given (the plugin's own silo with one behaviour changed), the
    server with `server`; every process must exit 0. Returns the run's folder."""
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 1, conformance.free_port())
    comm = [*LOCAL, "comm_args.backend=GRPC", f"comm_args.grpc_ipconfig_path={ipconfig}"]
    out, env = tmp_path / "run", conformance.process_env(tmp_path)
    cmds = {}
    for r, own in sites.items():
        cmd = [*conformance.cli_command("run", CONFIG, [*comm, *own], out), "--rank", str(r)]
        if r in (scripts or {}):  # tests/support/SCRIPT run ... in place of -m fedml_moon run ...
            cmd = [cmd[0], str(ROOT / "tests" / "support" / scripts[r]), *cmd[3:]]
        cmds[f"silo-{r}"] = cmd
    cmds["server"] = [*conformance.cli_command("run", CONFIG, [*comm, *server], out), "--rank", "0"]
    procs = [conformance.spawn(cmd, tmp_path / f"{name}.log", env, tmp_path) for name, cmd in cmds.items()]
    codes = conformance.wait_all(procs, 300)
    assert codes == [0] * len(procs), (tmp_path / "server.log").read_text()[-3000:]
    return out


def _same_model(a: Path, b: Path) -> None:
    x = torch.load(a / "final_model.pt", weights_only=True)
    y = torch.load(b / "final_model.pt", weights_only=True)
    assert all(torch.equal(x[k], y[k]) for k in x), "another final model"


def _tables(root: Path) -> Path:
    """Each site's own train.parquet / test.parquet (its images pooled to 49 features, its classes),
    and the same rows in one table with a `site` column (the standalone run's per-party table)."""
    frames = []
    for k, (name, keep) in enumerate(sorted(MIXES.items())):
        x, y, xt, yt = fashion(120, 40, k * 120, k * 40)
        for split, (xs, ys) in (("train", (x, y)), ("test", (xt, yt))):
            kept = np.isin(ys, keep)
            frame = table_frame(xs[kept], ys[kept])
            (root / name).mkdir(parents=True, exist_ok=True)
            frame.to_parquet(root / name / f"{split}.parquet", index=False)
            frames.append((split, frame.assign(site=name)))
    import pandas as pd

    for split in ("train", "test"):
        pd.concat([f for s, f in frames if s == split]).to_parquet(root / f"{split}.parquet", index=False)
    return root


def test_a_parquet_site_with_the_mlp_in_a_run_of_its_own(tmp_path):
    tables = _tables(tmp_path / "tables")
    run = [
        "data_args.dataset=table",
        f"data_args.classes=[{','.join(CLASSES)}]",
        "data_args.label_column=label",
        "data_args.channels=49",
        "data_args.image_size=null",
        "data_args.partition_method=natural",
        "model_args.model=mlp",
        "train_args.client_num_in_total=3",
        "train_args.client_num_per_round=3",
        "train_args.comm_round=2",
        "train_args.batch_size=32",
    ]
    whole = [*run, f"data_args.data_cache_dir={tables}", "data_args.party_column=site", *LOCAL[3:]]
    ref = conformance.run_mode("standalone", CONFIG, whole, tmp_path / "reference")
    assert ref.ok, ref.tail()
    own = {r: [f"data_args.data_cache_dir={tables / name}"] for r, name in enumerate(sorted(MIXES), 1)}
    out = _grpc_run(tmp_path, own, [*run, _empty(tmp_path)])
    _same_model(ref.out_dir, out)
    assert _records(ref.out_dir) == _records(out)
    first = json.loads((ref.out_dir / "metrics.jsonl").read_text().splitlines()[-1])
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["test_acc"] == first["test_acc"]


def test_under_secure_aggregation_the_server_learns_the_counts_summed(tmp_path, sites):
    """Secure aggregation of the updates and of the sites' test counts over gRPC, site 1 lying about
    its counts (tests/support/lying_eval_silo.py): in round 0 it sends them in a clear REPORT, at once and
    after the others' keys, then its keys; in round 1 it adds 10^6 correct answers inside the secure
    sum. The same model as the standalone run of the same holdings under secure aggregation; round
    0's test figures those of its central test (only the secure sum is recorded: the REPORTs are
    refused); round 1 without test figures, logged (its sum counts more correct than samples); no
    site's own figures anywhere in the server's records."""
    secure = ["privacy_args.secure_aggregation=true", "train_args.client_num_per_round=3"]
    run = [*RUN, *secure, "train_args.comm_round=2", "train_args.checkpoint_every=0"]
    whole = [*run, f"data_args.data_cache_dir={sites}", *LOCAL[3:]]
    ref = conformance.run_mode("standalone", CONFIG, whole, tmp_path / "reference")
    assert ref.ok, ref.tail()
    out = _grpc_run(tmp_path, _own(sites), [*run, _empty(tmp_path)], {1: "lying_eval_silo.py"})
    _same_model(ref.out_dir, out)
    (x, y), (_, lied) = zip(_lines(ref.out_dir), _lines(out), strict=True)
    assert y["test_acc"] == x["test_acc"] and y["test_loss"] == pytest.approx(x["test_loss"], rel=1e-6)
    assert y["test_samples"] == sum(len(list((sites / name / "test").rglob("*.png"))) for name in MIXES)
    assert lied["round"] == 1 and not {"test_acc", "test_loss", "test_samples"} & set(lied), lied
    assert "party_test" not in y and "party_test" not in lied
    assert "site_mean_test_acc" not in y and y["pooled_test_acc"] == y["test_acc"]  # the sum's figure only
    text = (out / "summary.json").read_text()
    assert "party_test" not in text and json.loads(text)["final_round"] == 0
    said = (tmp_path / "server.log").read_text(errors="replace")
    assert said.count("refused rank 1's report: secure aggregation is on") == 2, said[-3000:]
    assert "outside [0, " in said and "no test figures this round" in said, said[-3000:]
    logs = {p.stem: p.read_text(errors="replace") for p in tmp_path.glob("*.log")}
    _sites_logged_their_results(out, logs)  # a site's own figures are its own: it logs them
    _sites_hold_the_final_model(out)


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
