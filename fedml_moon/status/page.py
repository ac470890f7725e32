"""A run's status as an HTML page (what the status port serves at `/`): the same facts as
`fedml-moon status`, with the curves drawn as inline SVG (test accuracy and loss, round time, sites
per round). No script and no outside resource: the page reloads itself every few seconds."""

from __future__ import annotations

import html
import math
from typing import Any

from fedml_moon.status.record import ago, privacy_lines, round_of, site_state

REFRESH_S = 2
CHART = (360, 130)  # an SVG chart's width and height, in pixels
MARGIN = (48, 10, 8, 24)  # left (the scale), right, top, bottom (the rounds)


def chart(title: str, points: list[tuple[float, float]], unit: str = "", top: float | None = None) -> str:
    """A line of (round, value) points on axes: the rounds below, a scale from 0 on the left (to `top`,
    or the largest value), so that a fall shows as far as it goes; the title and the last value."""
    points = [(x, y) for x, y in points if isinstance(y, (int, float)) and math.isfinite(y)]
    width, height = CHART
    left, right, up, down = MARGIN
    if not points:
        return f"<figure><figcaption>{html.escape(title)}: —</figcaption></figure>"
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0 = min(xs), max(xs), min(0.0, min(ys))
    y1 = top if top is not None else max(ys)
    y1 = y1 if y1 > y0 else y0 + 1.0

    def px(x: float) -> float:
        return left + (width - left - right) * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def py(y: float) -> float:
        return height - down - (height - up - down) * (y - y0) / (y1 - y0)

    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5"/>' for x, y in points[-40:])
    scale = "".join(
        f'<text x="{left - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{_number(v)}{html.escape(unit)}</text>'
        f'<line x1="{left}" x2="{width - right}" y1="{py(v):.1f}" y2="{py(v):.1f}" class="grid"/>'
        for v in (y0, (y0 + y1) / 2, y1)
    )
    rounds = "".join(
        f'<text x="{px(x):.1f}" y="{height - 6}" text-anchor="middle">{int(x)}</text>'
        for x in sorted({x0, x1})
    )
    axes = (
        f'<line x1="{left}" x2="{left}" y1="{up}" y2="{height - down}" class="axis"/>'
        f'<line x1="{left}" x2="{width - right}" y1="{height - down}" y2="{height - down}" class="axis"/>'
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" text-anchor="middle">round</text>'
    )
    last = f"{_number(ys[-1])}{unit} (round {int(xs[-1])})"
    return (
        f'<figure><figcaption>{html.escape(title)}: <b class="value">{html.escape(last)}</b></figcaption>'
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(title)} per round">'
        f'{scale}{axes}{rounds}<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="{line}"/>'
        f'<g fill="#1f6feb">{dots}</g></svg></figure>'
    )


def _number(value: float) -> str:
    return f"{value:.4g}"


def _site_row(site: dict[str, Any]) -> str:
    state = site_state(site)
    cells = [
        str(site.get("rank")),
        state,
        "—" if state == "not yet connected" else ago(site.get("last_heard_s")),
        str(site.get("rounds", 0)),
        str(site.get("refused", 0)),
    ]
    body = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
    return f'<tr class="site {state.replace(" ", "-")}" id="site-{site.get("rank")}">{body}</tr>'


def render_html(status: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The page for `status` (`fedml_moon.status.record.read`, as this viewer may see it) and the round
    records it may see (`round`, `test_acc`, `test_loss`, `round_time_s`, `parties`)."""
    esc = html.escape
    head = f"{status.get('algorithm') or ''}, {round_of(status)}, {status.get('phase')}"
    rows = [(r["round"], r) for r in records if isinstance(r.get("round"), int)]
    latest = status.get("latest") or {}
    eta = status.get("eta_s")
    facts = [
        f"test accuracy {latest['test_acc']:.4f}, loss {latest['test_loss']:.4f} (round {latest['round']})"
        if latest.get("test_acc") is not None and latest.get("test_loss") is not None
        else "no test figures yet",
        f"round time {status['round_time_s']:.1f} s" if status.get("round_time_s") else "round time —",
        f"done in about {eta:.0f} s" if eta else "",
        f"status written {ago(status['written_s_ago'])}" if status.get("written_s_ago") is not None else "",
        *privacy_lines(status),
    ]
    charts = [
        chart("test accuracy", [(i, r.get("test_acc")) for i, r in rows], top=1.0),
        chart("test loss", [(i, r.get("test_loss")) for i, r in rows]),
        chart("round time", [(i, r.get("round_time_s")) for i, r in rows], " s"),
        chart("parties per round", [(i, r.get("parties")) for i, r in rows]),
    ]
    sites = status.get("sites") or []
    table = (
        "<table><thead><tr><th>site</th><th>state</th><th>last heard</th><th>rounds</th><th>refused</th>"
        f"</tr></thead><tbody>{''.join(_site_row(s) for s in sites)}</tbody></table>"
        if sites
        else ""
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>{esc(str(status.get('run')))}: {esc(head)}</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:1.5em}figure{display:inline-block;margin:.5em}"
        "td,th{padding:.2em .8em;text-align:left}.gone{color:#b00}.not-yet-connected{color:#666}"
        "svg{background:#f6f8fa;font:11px system-ui,sans-serif}svg text{fill:#444}"
        ".axis{stroke:#444}.grid{stroke:#d0d7de;stroke-dasharray:2 3}</style></head>"
        f'<body><h1>run {esc(str(status.get("run")))}</h1><p id="state">{esc(head)}</p>'
        f"<p>{'<br>'.join(esc(f) for f in facts if f)}</p>{''.join(charts)}{table}</body></html>"
    )
