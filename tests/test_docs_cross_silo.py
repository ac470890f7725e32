"""The cross-silo tutorials' commands (docs/tutorials/cross-silo.md,
docs/tutorials/cross-silo-own-data.md): certificates, the server and three silos with mutual TLS, the
status port watched and scraped, and sites with their own data; run as written at tiny scale
(tests/support/doc_runs.py), from a scratch folder holding `certs/` and the sites' folders. Every
process started here runs on 127.0.0.1, has its wait bounded and is stopped at the end."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import time

import pytest

from fedml_moon import conformance
from tests.support import ROOT
from tests.support.cli import restored_main
from tests.support.doc_commands import (
    CERTS_LOCAL,
    OWN_CERTS,
    OWN_CHECK,
    OWN_SERVER,
    OWN_SILOS,
    SCRAPE,
    SCRAPE_CONFIG,
    TLS_SERVER,
    TLS_SILO,
    WATCH_STATUS,
    WATCHED_SERVER,
)
from tests.support.doc_runs import (
    completed,
    entry_point,
    grpc_comm,
    quiet,
    run_all,
    shell_env,
    tiny_sets,
    wait_for_log,
)
from tests.support.marks import needs_fmnist
from tests.support.site_data import party_folders


@needs_fmnist
@pytest.mark.slow
def test_grpc_tls_commands(tmp_path, home, capsys):
    """The cross-silo tutorial: certificates for 3 silos on 127.0.0.1, the server with TLS and its
    certificate and, as "Watch the run" starts it, its status port; silos 1 to 3 with theirs (mutual
    TLS), run as written from a folder holding `certs/` (the run's ipconfig CSV and the status port on
    free ports). Before the silos come, the operator's and a site's `fedml-moon status` of the port,
    and a real Prometheus started with the example configuration copied beside `certs/` (listening on
    a free loopback port), which scrapes the port over TLS as the operator."""
    from tests.support import monitoring

    started = time.monotonic()
    work = tmp_path / "work"
    work.mkdir()
    certs = work / "certs"
    with restored_main() as main:
        assert main([str(certs) if w == "certs/" else w for w in entry_point(CERTS_LOCAL)]) == 0
    out = tmp_path / "run"
    comm = grpc_comm(tmp_path, out)
    port = conformance.free_port()

    def placed(command: str, rank: str = "0") -> list[str]:
        words = shlex.split(command.replace("RANK", rank).replace("8891", str(port)))
        return [re.sub(r"(^|=)certs/", rf"\g<1>{certs}/", w) for w in words]

    silos = [[*placed(TLS_SILO, str(r)), *comm, "--set", "device_args.torch_threads=1"] for r in (1, 2, 3)]
    server = [*placed(WATCHED_SERVER), *tiny_sets(WATCHED_SERVER), *comm]
    logs = [tmp_path / "logs" / f"process-{i}.log" for i in range(4)]
    logs[0].parent.mkdir()
    with contextlib.ExitStack() as stack:
        procs = [conformance.spawn(server, logs[-1], shell_env(home), ROOT)]
        stack.callback(lambda: [conformance.stop(p) for p in procs])
        wait_for_log(logs[-1], f"status port: https://127.0.0.1:{port}/", 120)
        with restored_main() as main:
            deadline = time.monotonic() + 60
            while True:  # the port answers from its opening; the run's status once the server has one
                assert main(placed(WATCH_STATUS)[1:]) == 0
                said = capsys.readouterr().out
                if "round 0 of 1 (from 0), waiting for sites" in said or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert (
                "round 0 of 1 (from 0), waiting for sites" in said
                and "site rank 3: not yet connected" in said
            ), said
            site = [w.replace("operator.token", "silo-1.token") for w in placed(WATCH_STATUS)[1:]]
            assert main([*site, "--json"]) == 0
            assert [s["rank"] for s in json.loads(capsys.readouterr().out)["sites"]] == [1]
        copy, source, target = shlex.split(SCRAPE_CONFIG)  # here: into the folder holding certs/
        assert copy == "cp" and target == "prometheus.yml"
        config = work / target
        config.write_text((ROOT / source).read_text().replace("8891", str(port)))
        listen = f"127.0.0.1:{conformance.free_port()}"  # the command's loopback address, on a free port
        prometheus = [w.replace("127.0.0.1:9090", listen) for w in shlex.split(SCRAPE)]
        assert (
            f"--web.listen-address={listen}" in prometheus
            and "--storage.tsdb.path=outputs/prometheus" in prometheus
        )
        procs.append(
            conformance.spawn(prometheus, tmp_path / "logs" / "prometheus.log", shell_env(home), work)
        )
        monitoring.Prometheus(f"http://{listen}/").until("fedml_moon_rounds_planned", 1)
        assert (work / "outputs" / "prometheus").is_dir() and not (work / "data").exists()  # its store
        for cmd, log_path in zip(silos, logs, strict=False):
            procs.append(conformance.spawn(cmd, log_path, shell_env(home), ROOT))
        codes = conformance.wait_all([procs[0], *procs[2:]], 420)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    assert codes == [0, 0, 0, 0], tails
    for log_path in logs:
        quiet(log_path)
    assert "(TLS True, auth mtls)" in logs[-1].read_text()  # the server's log: TLS on, silos by certificate
    completed(out, 1)
    # started again as written in step 2, the server refuses the folder of this run's records
    again = [*placed(TLS_SERVER), *tiny_sets(TLS_SERVER), *comm]
    again = subprocess.run(again, cwd=ROOT, env=shell_env(home), capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "holds an earlier run's records" in again.stderr, again.stderr[-2000:]
    assert "--overwrite" in again.stderr and f"--resume {out}" in again.stderr
    completed(out, 1)
    print(f"gRPC + TLS README commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_own_data_tutorial_commands(tmp_path, home):
    """Cross-silo with your own data: certificates with a cap per site, the server with no data and
    three sites each with its own folder (mutual TLS), run as written with the sites' folders and
    `site-certs/` in a scratch folder, one tiny round; the server says it holds no data, the sites'
    counts make the record."""
    started = time.monotonic()
    work = tmp_path / "work"
    sites = party_folders(work / "data" / "site" / "parties", per_party=40, n_test=10)
    certs = work / "site-certs"
    with restored_main() as main:
        assert main([str(certs) if w == "site-certs/" else w for w in entry_point(OWN_CERTS)]) == 0
        check = [str(sites / "party-a") if w.startswith("data/") else w for w in entry_point(OWN_CHECK)]
        assert main(check) == 0  # the site's folder passes the silo's start-up reading
    out = tmp_path / "run"
    comm = grpc_comm(tmp_path, out)
    tiny = ["train_args.comm_round=1", "train_args.epochs=1", "train_args.batch_size=16"]
    tiny += ["device_args.torch_threads=1", "tracking_args.enable_wandb=false"]

    def placed(command: str) -> list[str]:
        words = shlex.split(command)
        return [
            w.replace("=site-certs/", f"={certs}/").replace("=data/site/parties/", f"={sites}/")
            for w in words
        ]

    silos = [[*placed(c), *comm, "--set", "device_args.torch_threads=1"] for c in OWN_SILOS]
    server = [*placed(OWN_SERVER), *(a for t in tiny for a in ("--set", t)), *comm]
    logs = run_all([*silos, server], tmp_path / "logs", home, 420)
    for log_path in logs:
        quiet(log_path)
    said = logs[-1].read_text()
    assert (
        "the server holds no training data; evaluation is federated" in said
        and "(TLS True, auth mtls)" in said
    )
    completed(out, 1)
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["party_test"]) == {"0", "1", "2"} and record["test_samples"] > 0
    claims = json.loads((out / "claims.json").read_text())
    assert sorted(claims) == ["0", "1", "2"] and all(c["samples"] <= 20000 for c in claims.values())
    print(f"own-data tutorial commands: {time.monotonic() - started:.1f} s")
