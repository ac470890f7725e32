"""The status port (`fedml_moon.status.http`) from a client's side, on a run folder the way a server
writes it: a real HTTP server on 127.0.0.1 (threads of this process), real requests. Who sees what
(no credentials: 401 and nothing else; a site: its own entry and the run's shared figures; the
operator: all, and the metrics), its bounds (rate, open requests, methods, bodies, a stalled
client), TLS with the run's certificates, and that readers never make the server's files be read
more than twice a second. A live run's port, with a killed site shown as gone on the page, in the
JSON and in the metrics: tests/test_dead_silo.py."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from fedml_moon.security import make_certs
from fedml_moon.status import app as status_app
from fedml_moon.status import http as status_http
from fedml_moon.status import record as run_status
from fedml_moon.status.app import StatusApp, load_viewers
from fedml_moon.status.http import StatusPort
from tests.support.status_port import SITES, Client, serve, token_of, write_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder, 2, ["127.0.0.1"])
    return folder


@pytest.fixture
def run(tmp_path) -> Path:
    return write_run(tmp_path / "run")


@pytest.fixture
def served(run, certs):
    """The port, its rate bound out of the way (its own test has it)."""
    client = serve(run, certs, 1000)
    yield client
    client.port.stop()


def test_without_credentials_a_client_gets_a_refusal_and_nothing_else(served, certs):
    wrong = [
        (None, None),
        ("operator", "not-the-token"),
        ("operator", token_of(certs, "silo-1")),  # a site's token is not the operator's
        ("silo-2", token_of(certs, "silo-1")),  # nor another site's
        ("silo-9", token_of(certs, "silo-1")),  # a site the run does not have
        ("silo-1:x", token_of(certs, "silo-1")),
    ]
    for path in ("/", "/status.json", "/metrics", "/nothing"):
        for who, token in wrong:
            code, headers, body = served.get(path, who, token)
            assert (code, body) == (401, b""), (path, who)
            assert headers["WWW-Authenticate"].startswith("Basic")
    code, _, body = served.get("/status.json", "operator", token_of(certs, "operator"))
    assert code == 200 and json.loads(body)["round"] == 3


def test_the_operator_sees_every_site_and_the_metrics(served, certs):
    from prometheus_client.parser import text_string_to_metric_families

    token = token_of(certs, "operator")
    status = json.loads(served.get("/status.json", "operator", token)[2])
    assert [s["rank"] for s in status["sites"]] == [1, 2]
    assert status["latest"]["test_acc"] == pytest.approx(0.7)
    code, headers, body = served.get("/metrics", "operator", token)
    assert code == 200 and headers["Content-Type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(body.decode()) for s in f.samples}  # fmt: skip
    assert samples[("fedml_moon_round", ())] == 3 and samples[("fedml_moon_rounds_planned", ())] == 10
    assert samples[("fedml_moon_rounds_completed_total", ())] == 3
    assert samples[("fedml_moon_test_accuracy", ())] == pytest.approx(0.7)
    assert samples[("fedml_moon_sites_connected", ())] == 1
    assert samples[("fedml_moon_site_connected", (("site", "2"),))] == 0
    assert samples[("fedml_moon_site_refused_total", (("site", "2"),))] == 7
    assert samples[("fedml_moon_site_last_heard_seconds", (("site", "2"),))] >= 40
    assert samples[("fedml_moon_wire_bytes_sent_total", ())] == 300
    assert samples[("fedml_moon_site_messages_total", (("site", "2"),))] == 12
    assert samples[("fedml_moon_refused_total", (("reason", "too big"),))] == 5
    assert samples[("fedml_moon_parties_missing_total", ())] == 1
    assert samples[("fedml_moon_parties_missing_last_round", ())] == 0
    assert samples[("fedml_moon_site_bytes_received_total", (("site", "1"),))] == 9000
    assert samples[("fedml_moon_site_bytes_sent_total", (("site", "2"),))] == 2500
    assert samples[("fedml_moon_phase", (("phase", "training"),))] == 1
    page = served.get("/", "operator", token)[2].decode()
    assert "round 3 of 10 (from 0), training" in page and 'class="site gone" id="site-2"' in page
    everything = b"".join(served.get(p, "operator", token)[2] for p in ("/", "/status.json", "/metrics"))
    assert b"party_test" not in everything  # no per-site test figure on the port, for anyone


def test_the_example_dashboard_asks_only_for_metrics_the_port_serves(served, certs):
    from prometheus_client.parser import text_string_to_metric_families

    body = served.get("/metrics", "operator", token_of(certs, "operator"))[2].decode()
    served_names = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    dashboard = json.loads((ROOT / "examples" / "monitoring" / "grafana-dashboard.json").read_text())
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"fedml_moon_\w+", target["expr"])
    }
    # a DP run's epsilons are served from a real DP run's records: tests/test_dp_released.py
    assert len(asked) >= 12 and asked - served_names == {"fedml_moon_dp_epsilon"}, sorted(
        asked - served_names
    )
    charts = [p for p in dashboard["panels"] if p["type"] == "timeseries"]
    assert len(charts) >= 8  # each on a scale from 0, as the page's: 3 parties to 2 is a third down
    assert all(p["fieldConfig"]["defaults"]["min"] == 0 for p in charts), [p["title"] for p in charts]


def test_a_site_sees_the_runs_shared_figures_and_its_own_entry_only(served, certs):
    token = token_of(certs, "silo-1")
    status = json.loads(served.get("/status.json", "silo-1", token)[2])
    (mine,) = status["sites"]
    assert {k: mine[k] for k in ("rank", "connected", "rounds", "refused")} == {
        k: SITES[0][k] for k in ("rank", "connected", "rounds", "refused")
    }
    assert mine["last_heard_s"] == pytest.approx(0, abs=30)
    assert status["round"] == 3 and status["latest"]["test_acc"] == pytest.approx(0.7)
    page = served.get("/", "silo-1", token)[2].decode()
    assert 'id="site-1"' in page and 'id="site-2"' not in page and "party_test" not in page
    assert served.get("/metrics", "silo-1", token)[0] == 403
    everything = b"".join(served.get(p, "silo-1", token)[2] for p in ("/", "/status.json", "/metrics"))
    assert b"party_test" not in everything and b'"rank": 2' not in everything


def test_the_operators_config_may_show_a_site_every_site(run, certs):
    app = StatusApp(run, load_viewers(certs / "server-tokens.json"), sites_visible=True)
    status, records = app.view("silo-1")
    assert [s["rank"] for s in status["sites"]] == [1, 2]
    mine, other = status["sites"]
    assert mine["messages"] == 40 and mine["bytes_sent"] == 8000  # its own line, whole
    assert set(other) == {"rank", "connected", "heard_at", "last_heard_s", "rounds", "refused"}  # the line
    assert all("wire_bytes_sent" not in r and "party_test" not in r for r in records)


def test_only_get_and_head_without_a_body_and_the_three_paths(served, certs):
    token = token_of(certs, "operator")
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        assert served.get("/status.json", "operator", token, method=method)[0] == 405
    assert served.get("/status.json", "operator", token, body=b"x" * 10)[0] == 413
    assert served.get("/status.json", "operator", token, method="HEAD")[2] == b""
    assert served.get("/../summary.json", "operator", token)[0] == 404
    assert served.get("/checkpoint/LATEST", "operator", token)[0] == 404


def test_a_client_past_its_rate_is_told_to_wait_and_others_are_not(run, certs):
    served, token, n = serve(run, certs, status_app.RATE), token_of(certs, "operator"), status_app.RATE
    try:
        codes = [served.get("/status.json", "operator", token)[0] for _ in range(n)]
        codes += [served.get("/status.json", "operator", token)[0] for _ in range(3)]
        assert codes == [200] * n + [429] * 3
        assert served.get("/status.json", "silo-1", token_of(certs, "silo-1"))[0] == 200  # another user
        anonymous = [served.get("/", None, None)[0] for _ in range(n + 2)]  # no credentials: one budget
        assert anonymous == [401] * n + [429] * 2
        assert served.port.server.app.allowed("127.0.0.2 operator")  # another address is not held back
    finally:
        served.port.stop()


def test_stalled_clients_neither_block_others_nor_pile_up(served, certs):
    token = token_of(certs, "operator")
    idle = [socket.create_connection(("127.0.0.1", served.port.port)) for _ in range(2)]
    try:
        assert served.get("/status.json", "operator", token)[0] == 200  # served beside them
    finally:
        for s in idle:
            s.close()
    crowd = [socket.create_connection(("127.0.0.1", served.port.port)) for _ in range(status_http.MAX_OPEN)]
    try:
        deadline = time.monotonic() + 30
        while served.port.server.open < status_http.MAX_OPEN:  # the crowd's requests are all being served
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            served.get("/status.json", "operator", token)  # one more: closed unanswered
    finally:
        for s in crowd:
            s.close()
    deadline = time.monotonic() + 30
    while served.port.server.open > 0:  # the closed clients' threads end
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert served.get("/status.json", "operator", token)[0] == 200


def test_readers_read_the_run_at_most_twice_a_second(served, certs, monkeypatch):
    reads = []
    real = run_status.read
    monkeypatch.setattr(
        run_status, "read", lambda folder, *rows: reads.append(time.monotonic()) or real(folder, *rows)
    )
    token = token_of(certs, "operator")
    started = time.monotonic()
    threads = [threading.Thread(target=served.get, args=("/", "operator", token)) for _ in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= len(reads) <= (time.monotonic() - started) / status_app.FRESH_S + 1


def test_over_tls_with_the_runs_certificates(run, certs):
    app = StatusApp(run, load_viewers(certs / "server-tokens.json"))
    port = StatusPort(app, "127.0.0.1", 0, (str(certs / "server.pem"), str(certs / "server.key"))).start()
    try:
        assert port.url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        trusted.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default: RFC 5280's key ids, usage
        code, _, body = Client(port, trusted).get("/status.json", "operator", token_of(certs, "operator"))
        assert code == 200 and json.loads(body)["run"] == "run"
        with pytest.raises(ssl.SSLError):
            Client(port, ssl.create_default_context()).get("/status.json")  # not the run's CA
        plain = Client(port).get  # plain HTTP to the TLS port gets no status
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain("/status.json", "operator", token_of(certs, "operator"))
    finally:
        port.stop()


def test_a_port_without_credentials_or_off_loopback_without_tls_is_refused(run, certs):
    from fedml_moon.config.load import ConfigError, load_config

    base = ROOT / "config" / "fashion_mnist" / "moon.yaml"
    assert status_http.open_port(load_config(base), run) is None  # off by default
    for sets, said in (
        (["tracking_args.status_port=0"], "tracking_args.status_tokens"),
        ([f"tracking_args.status_tokens={certs / 'none.json'}", "tracking_args.status_port=0"], "not a file"),
        ([f"tracking_args.status_tokens={certs / 'server-tokens.json'}", "tracking_args.status_port=0",
          "tracking_args.status_host=0.0.0.0"], "tracking_args.status_host"),
        (["tracking_args.status_port=70000"], "tracking_args.status_port"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=said):
            status_http.open_port(load_config(base, sets), run)
    assert run_status.read(run)["round"] == 3  # nothing of the run touched


def test_fedml_moon_status_reads_a_live_port_as_the_operator_or_a_site(run, certs, capsys, tmp_path):
    from fedml_moon.cli import main

    app = StatusApp(run, load_viewers(certs / "server-tokens.json"))
    port = StatusPort(app, "127.0.0.1", 0, (str(certs / "server.pem"), str(certs / "server.key"))).start()
    try:
        ca = ["--ca", str(certs / "ca.pem")]
        assert main(["status", port.url, "--token", str(certs / "operator.token"), *ca]) == 0
        said = capsys.readouterr().out
        assert "round 3 of 10 (from 0), training" in said and "site rank 2: gone" in said, said
        assert main(["status", port.url, "--token", str(certs / "silo-1.token"), *ca, "--json"]) == 0
        assert [s["rank"] for s in json.loads(capsys.readouterr().out)["sites"]] == [1]
        (tmp_path / "silo-2.token").write_text("not-its-token")
        assert main(["status", port.url, "--token", str(tmp_path / "silo-2.token"), *ca]) == 2
        assert "refused silo-2's credentials" in capsys.readouterr().err
        assert main(["status", port.url, "--token", str(certs / "operator.token")]) == 2  # not the run's CA
        assert "is not one the --ca (the system store) issued" in capsys.readouterr().err
    finally:
        port.stop()
    closed = port.url  # nothing listens there now: no config error, the address and what to check
    assert main(["status", closed, "--token", str(certs / "operator.token"), *ca]) == 1
    said = capsys.readouterr().err
    assert "no status from there" in said and "config error" not in said and "status_port" in said


def test_hostile_requests_get_an_error_and_leave_the_port_serving(served, certs):
    """A header too long, too many headers, a request line that is no HTTP, a client killed half way
    through its request: each gets an error or nothing, and the next honest request is answered."""
    token = token_of(certs, "operator")
    sends = [
        b"GET /status.json HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /status.json HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        b"\x16\x03\x01 not http at all\r\n\r\n",
        b"GET /status.json HTTP/1.1\r\nAuthorization: Basic ",  # then killed
    ]
    for raw in sends:
        with socket.create_connection(("127.0.0.1", served.port.port), timeout=10) as s:
            s.sendall(raw)
            if raw.endswith(b"Basic "):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                continue  # closed with a reset, mid-request
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(65536)
            assert reply == b"" or b"400" in reply or b"431" in reply, reply
            assert b"phase" not in reply and b"site" not in reply  # an error, nothing of the run
        code, _, body = served.get("/status.json", "operator", token)
        assert code == 200 and json.loads(body)["round"] == 3


def test_a_silos_own_port_shows_its_view_to_its_own_token_only(tmp_path, certs):
    """`tracking_args.site_status_port`: the silo's folder (what `fedml-moon status rank-<r>` reads)
    to the holder of its token, metrics included; the operator's token and another site's are
    refused (it is the site's, not the run's)."""
    from prometheus_client.parser import text_string_to_metric_families

    from fedml_moon.config.load import load_config

    folder = tmp_path / "run" / "rank-1"
    own = {"run": "run", "algorithm": "moon", "rounds": 10, "round": 4, "phase": "training"}
    own |= {"site": {"rank": 1, "rounds": 4, "samples": 640}}
    own |= {"server": {"connected": True, "heard_at": time.time()}}
    run_status.write(folder, {**own, "round_time_s": 3.0, "eta_s": 18.0})
    sets = ["tracking_args.site_status_port=0", f"tracking_args.site_status_token={certs / 'silo-1.token'}"]
    port = status_http.open_site_port(
        load_config(ROOT / "config" / "fashion_mnist" / "moon.yaml", sets), folder, 1
    )
    try:
        client = Client(port)
        for who in ("operator", "silo-2"):
            assert client.get("/status.json", who, token_of(certs, who))[0] == 401
        status = json.loads(client.get("/status.json", "silo-1", token_of(certs, "silo-1"))[2])
        assert status["site"] == {"rank": 1, "rounds": 4, "samples": 640} and status["server"]["connected"]
        body = client.get("/metrics", "silo-1", token_of(certs, "silo-1"))[2].decode()
        samples = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
        assert samples["fedml_moon_rounds_trained_total"] == 4 and samples["fedml_moon_server_connected"] == 1
        assert samples["fedml_moon_round_seconds"] == 3.0 and samples["fedml_moon_eta_seconds"] == 18.0
        assert samples["fedml_moon_samples"] == 640
        assert 0 <= samples["fedml_moon_server_last_heard_seconds"] < 60
    finally:
        port.stop()
