"""A live run's status port as its operator's tools see it (gRPC, 127.0.0.1; each round about a second,
a plugin whose steps sleep): the page in a real browser (Debian's `chromium`, headless) renders, shows
a newer round after a round ends and shows a killed site as gone; a real Prometheus (Debian's
`prometheus`), configured as `examples/monitoring/prometheus.yml` says, scrapes the port and answers
queries with the run's values, the site's fall among them; a silo's own port shows its view of the
run to its token. Starts the run's processes, Chromium and
Prometheus, because what is tested is what they see of each other."""

from __future__ import annotations

import base64
import contextlib
import re
import signal
import urllib.request
from pathlib import Path

from fedml_moon import conformance
from fedml_moon.security import make_certs
from tests.support import monitoring
from tests.support.marks import SLOW_WITH_DATA
from tests.support.monitoring import Port
from tests.support.processes import SLOW_STEPS, grpc_command, start_rank, wait_for_text

pytestmark = SLOW_WITH_DATA

ROUNDS = 30


def _round_shown(dom: str) -> int:
    return int(re.search(rf'<p id="state">[^<]*round (\d+) of {ROUNDS}', dom).group(1))


def test_the_page_in_a_browser_and_prometheus_follow_a_live_run_and_a_killed_site(tmp_path: Path):
    certs = tmp_path / "certs"
    make_certs(certs, 2, ["127.0.0.1"])
    number = conformance.free_port()
    sets = [*SLOW_STEPS, f"train_args.comm_round={ROUNDS}", "data_args.max_train_samples=200"]
    sets += ["comm_args.heartbeat_s=0.5", f"tracking_args.status_port={number}"]
    sets += [f"tracking_args.status_tokens={certs / 'server-tokens.json'}"]
    cmd, _ = grpc_command(tmp_path, 2, *sets)
    token = (certs / "operator.token").read_text()
    with contextlib.ExitStack() as stack:
        scraper = stack.enter_context(
            monitoring.prometheus(f"http://127.0.0.1:{number}/", certs / "operator.token", tmp_path / "prom")
        )  # before the run: it scrapes from the server's first moment
        own = conformance.free_port()  # silo 1's own port, read with its token
        silo_1 = [*cmd, "--set", f"tracking_args.site_status_port={own}"]
        silo_1 += ["--set", f"tracking_args.site_status_token={certs / 'silo-1.token'}"]
        started = [
            start_rank(cmd, 0, tmp_path),
            start_rank(silo_1, 1, tmp_path),
            start_rank(cmd, 2, tmp_path),
        ]
        for proc, _ in started:
            stack.callback(conformance.stop, proc)
        log = started[0][1]
        wait_for_text(log, "round 1:", 150)
        port = Port(log, certs / "operator.token")

        def look() -> str:
            return monitoring.browser_dom(port.url, "operator", token, tmp_path / "browser")

        first = _round_shown(look())
        wait_for_text(log, f"round {first}:", 60)  # the round after the one the page showed has ended
        assert _round_shown(look()) > first
        conformance.stop(started[2][0], first=signal.SIGKILL)
        port.until(2, connected=False)
        dom = look()
        assert 'class="site gone" id="site-2"' in dom and 'class="site connected" id="site-1"' in dom, dom
        scraper.until('min_over_time(fedml_moon_site_connected{site="2"}[10m])', 0)
        scraper.until('max_over_time(fedml_moon_site_connected{site="2"}[10m])', 1)  # it was there before
        scraper.until("fedml_moon_rounds_planned", ROUNDS)
        scraper.until("fedml_moon_sites_connected", 1)
        seen = _metrics(f"http://127.0.0.1:{own}/metrics", "silo-1", (certs / "silo-1.token").read_text())
        assert seen["fedml_moon_server_connected"] == 1 and seen["fedml_moon_rounds_trained_total"] >= first
        assert "fedml_moon_site_connected" not in seen  # a silo's own port: its view, nothing of others


def _metrics(url: str, user: str, token: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    auth = "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()
    with urllib.request.urlopen(
        urllib.request.Request(url, headers={"Authorization": auth}), timeout=10
    ) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
