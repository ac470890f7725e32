"""A server's status port as its operator's tools see it, for the tests: Debian's `chromium`
(headless: the page's DOM after it loaded) and a real Prometheus (Debian's `prometheus`) on 127.0.0.1,
scraping the port with `examples/monitoring/prometheus.yml`'s settings. Each starts real processes
and stops them: the browser per look, Prometheus when its `with` block ends. And the port read
as its operator reads it over plain HTTP (`Port`)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from fedml_moon import conformance
from tests.support import ROOT
from tests.support.processes import wait_for_text

NEEDED = "apt-get install chromium prometheus (bash run/setup.sh --tests installs them)"


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: {NEEDED}"
    return found


def browser_dom(url: str, user: str, token: str, profile: Path) -> str:
    """The DOM headless Chromium shows for `url`, logged in as `user` (HTTP Basic in the URL)."""
    parts = urllib.parse.urlsplit(url)
    netloc = f"{user}:{urllib.parse.quote(token, safe='')}@{parts.netloc}"
    argv = [_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
    done = subprocess.run(
        [*argv, "--dump-dom", urllib.parse.urlunsplit(parts._replace(netloc=netloc))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Prometheus:
    """A Prometheus server scraping one status port every second; `value(query)` asks its API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def value(self, query: str) -> float | None:
        """The query's single value now, or None while it has none."""
        ask = self.url + "api/v1/query?" + urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(ask, timeout=10) as reply:
                result = json.loads(reply.read())["data"]["result"]
        except OSError:
            return None
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def targets(self) -> str:
        """What Prometheus says of its scrapes (health, last error), for a failure's message."""
        try:
            with urllib.request.urlopen(self.url + "api/v1/targets", timeout=10) as reply:
                active = json.loads(reply.read())["data"]["activeTargets"]
        except OSError as err:
            return f"no answer ({err})"
        return "; ".join(f"{t['scrapeUrl']}: {t['health']} {t['lastError']}" for t in active)

    def until(self, query: str, wanted: float, within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        while (got := self.value(query)) != wanted:
            assert time.monotonic() < deadline, f"{query} is {got}, not {wanted}: {self.targets()}"
            time.sleep(0.5)


@contextmanager
def prometheus(port_url: str, token_file: Path, folder: Path) -> Iterator[Prometheus]:
    """Prometheus scraping the (plain HTTP, loopback) status port at `port_url` as the operator,
    configured from the example file with its target, password file and a 1 s interval."""
    config = yaml.safe_load((ROOT / "examples" / "monitoring" / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["basic_auth"]["username"] == "operator" and job["scheme"] == "https"
    job.update(scheme="http", scrape_interval="1s")
    del job["tls_config"]  # this port is plain HTTP on 127.0.0.1
    job["basic_auth"]["password_file"] = str(token_file)
    job["static_configs"] = [{"targets": [urllib.parse.urlsplit(port_url).netloc]}]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    listen = f"127.0.0.1:{conformance.free_port()}"
    argv = [_tool("prometheus"), f"--config.file={folder / 'prometheus.yml'}", "--log.level=warn"]
    argv += [f"--web.listen-address={listen}", f"--storage.tsdb.path={folder / 'data'}"]
    proc = conformance.spawn(argv, folder / "prometheus.log", conformance.process_env(folder), folder)
    try:
        yield Prometheus(f"http://{listen}/")
    finally:
        conformance.stop(proc)


class Port:
    """The server's status port as its operator reads it (the address its log names)."""

    def __init__(self, log: Path, token_file: Path) -> None:
        wait_for_text(log, "status port: http://127.0.0.1:", 30)
        self.url = re.search(r"status port: (http://127\.0\.0\.1:\d+/)", log.read_text()).group(1)
        self.auth = "Basic " + base64.b64encode(f"operator:{token_file.read_text()}".encode()).decode()

    def get(self, path: str) -> str:
        request = urllib.request.Request(self.url + path.lstrip("/"), headers={"Authorization": self.auth})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.read().decode()

    def until(self, rank: int, connected: bool, within_s: float = 30.0) -> None:
        """Once the page, the JSON and the metrics all say site `rank` is (not) connected."""
        state, value = ("connected", "1.0") if connected else ("gone", "0.0")
        deadline = time.monotonic() + within_s
        while True:
            sites = json.loads(self.get("/status.json"))["sites"]
            said = [
                site_entry({"sites": sites}, rank)["connected"] is connected,
                f'class="site {state}" id="site-{rank}"' in self.get("/"),
                f'fedml_moon_site_connected{{site="{rank}"}} {value}' in self.get("/metrics"),
            ]
            if all(said):
                return
            assert time.monotonic() < deadline, (said, sites)
            time.sleep(1.0)


def site_entry(status: dict, rank: int) -> dict:
    """Site `rank`'s entry of a run's status."""
    return next(site for site in status["sites"] if site["rank"] == rank)
