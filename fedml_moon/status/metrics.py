"""A run's status as Prometheus metrics (what the status port serves at `/metrics`, to the operator),
through `prometheus_client`'s exposition format. Each scrape reads the run's status and records as
`fedml-moon status` does; nothing is kept between scrapes. The operations how-to says what each
metric means (docs/how-to/operate.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

PREFIX = "fedml_moon_"


GAUGES = (  # name, what it is, where it is read: ("status" | "latest" | "last", field)
    ("round", "the round in progress (numbered from 0, as in metrics.jsonl)", "status", "round"),
    ("rounds_planned", "the rounds the run is to train (train_args.comm_round)", "status", "rounds"),
    ("round_seconds", "mean wall time of the last 10 rounds", "status", "round_time_s"),
    ("last_round_seconds", "wall time of the last recorded round", "last", "round_time_s"),
    ("eta_seconds", "estimated seconds to the run's end", "status", "eta_s"),
    ("test_accuracy", "the latest test accuracy", "latest", "test_acc"),
    ("test_loss", "the latest test loss", "latest", "test_loss"),
    ("parties_last_round", "parties whose updates the last round aggregated", "last", "parties"),
)
EPSILONS = (  # the label `against` of fedml_moon_dp_epsilon, and the record field it reads
    ("release", "dp_epsilon_release"),
    ("sample_known", "dp_epsilon_sample_known"),
    ("server", "dp_epsilon_server"),
)
EPSILON_DOC = (
    "the DP epsilon spent so far (privacy_args, for dp_delta), by whom it holds against: release, an "
    "observer of the models who does not know the sample; sample_known, anyone who knows it (every site, "
    "a reader of the records); server, the server under secure aggregation"
)
TOTALS = (
    ("wire_bytes_sent", "bytes the server sent over the recorded rounds"),
    ("wire_bytes_received", "bytes the server received over the recorded rounds"),
)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _families(status: dict[str, Any], records: list[dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    where = {"status": status, "latest": status.get("latest") or {}, "last": records[-1] if records else {}}
    for name, doc, source, field in GAUGES:
        value = where[source].get(field)
        if _number(value):
            yield GaugeMetricFamily(PREFIX + name, doc, value=float(value))
    epsilon = GaugeMetricFamily(PREFIX + "dp_epsilon", EPSILON_DOC, labels=["against"])
    for label, field in EPSILONS:
        if _number(where["last"].get(field)):
            epsilon.add_metric([label], float(where["last"][field]))
    yield from [epsilon] if epsilon.samples else []
    done = CounterMetricFamily(PREFIX + "rounds_completed", "rounds recorded in metrics.jsonl")
    done.add_metric([], float(status.get("rounds_completed") or 0))
    yield done
    for field, doc in TOTALS:
        total = CounterMetricFamily(PREFIX + field, doc)
        total.add_metric([], float(sum(r[field] for r in records if _number(r.get(field)))))
        yield total
    missing = [len(r.get("missing_parties") or []) for r in records]
    doc = "parties left out of the last round's aggregate (gone, late, or dropped from a secure sum)"
    yield from (
        [GaugeMetricFamily(PREFIX + "parties_missing_last_round", doc, value=missing[-1])] if missing else []
    )
    left_out = CounterMetricFamily(
        PREFIX + "parties_missing", "parties left out of aggregates, over the rounds"
    )
    left_out.add_metric([], float(sum(missing)))
    yield left_out
    refused = CounterMetricFamily(
        PREFIX + "refused", "messages the server refused, by reason", labels=["reason"]
    )
    for reason, n in sorted((status.get("refused") or {}).items()):
        if _number(n):
            refused.add_metric([str(reason)], float(n))
    yield refused
    phase = GaugeMetricFamily(PREFIX + "phase", "1 for the phase the run is in", labels=["phase"])
    phase.add_metric([str(status.get("phase"))], 1.0)
    yield phase
    yield from _site_families(status.get("sites") or [])
    yield from _own_view(status)


def _own_view(status: dict[str, Any]) -> Iterator[Any]:
    """A silo's own port: the rounds it trained and its view of the server."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    server, site = status.get("server"), status.get("site")
    if isinstance(site, dict) and _number(site.get("samples")):
        doc = "training samples of this silo's parties"
        yield GaugeMetricFamily(PREFIX + "samples", doc, value=float(site["samples"]))
    if isinstance(site, dict) and _number(site.get("rounds")):
        trained = CounterMetricFamily(PREFIX + "rounds_trained", "rounds this silo trained")
        trained.add_metric([], float(site["rounds"]))
        yield trained
    if isinstance(server, dict):
        up = 1.0 if server.get("connected") else 0.0
        yield GaugeMetricFamily(PREFIX + "server_connected", "1 while the server is connected", value=up)
        if _number(server.get("last_heard_s")):
            doc = "seconds since the server was heard"
            yield GaugeMetricFamily(
                PREFIX + "server_last_heard_seconds", doc, value=float(server["last_heard_s"])
            )


def _site_families(sites: list[dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    site = ["site"]
    connected = GaugeMetricFamily(PREFIX + "site_connected", "1 while the site is connected", labels=site)
    heard = GaugeMetricFamily(PREFIX + "site_last_heard_seconds", "seconds since it was heard", labels=site)
    rounds = CounterMetricFamily(PREFIX + "site_rounds", "rounds it took part in", labels=site)
    refused = CounterMetricFamily(PREFIX + "site_refused", "its messages the server refused", labels=site)
    traffic = {
        "messages": CounterMetricFamily(
            PREFIX + "site_messages", "its messages the server took", labels=site
        ),
        "bytes_received": CounterMetricFamily(PREFIX + "site_bytes_received", "bytes of them", labels=site),
        "bytes_sent": CounterMetricFamily(
            PREFIX + "site_bytes_sent", "bytes the server sent it", labels=site
        ),
    }
    for entry in sites:
        label = [str(entry.get("rank"))]
        connected.add_metric(label, 1.0 if entry.get("connected") else 0.0)
        if _number(entry.get("last_heard_s")):
            heard.add_metric(label, float(entry["last_heard_s"]))
        rounds.add_metric(label, float(entry.get("rounds") or 0))
        refused.add_metric(label, float(entry.get("refused") or 0))
        for field, family in traffic.items():
            if _number(entry.get(field)):
                family.add_metric(label, float(entry[field]))
    total = GaugeMetricFamily(PREFIX + "sites_connected", "sites connected now")
    total.add_metric([], float(sum(1 for s in sites if s.get("connected"))))
    yield from (total, connected, heard, rounds, refused, *traffic.values())


def exposition(status: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
    """The metrics of `status` and `records` in Prometheus's text format."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    class _Now:
        def collect(self) -> Iterator[Any]:
            return _families(status, records)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Now())
    return generate_latest(registry)
