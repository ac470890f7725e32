"""What a run is doing, from its output folder: `fedml-moon status RUN_DIR`.

Every run writes `status.json` beside its records (`metrics.jsonl`, `summary.json`): the run's name,
algorithm, rounds planned, the round it is in and its phase; the server of a distributed run adds
each site (its rank: connected or gone, seconds since it was last heard, the rounds it took part
in, the messages of it that were refused). The server rewrites the file as its phase changes, at
most once a second, and each round's record rewrites it; a reader sees the old file or the new one,
never a part. `read` joins it with the records: the latest test figures and their curve, the mean
round time and an estimate of the end. A folder without `status.json` (a run of an earlier version)
is read from its records alone. A silo writes its own in its folder (`<output>/rank-<r>/`): the
round the server last gave it, its phase, the rounds it trained, the server (connected or not, when
last heard) and the run's pace as the silo sees it (`fedml_moon.distributed.silo.status`).

Phases: `waiting for sites` (before round one, or sites of a resumed run coming back), `training`,
`secure summing` (secure aggregation's key, share and unmask exchanges), `evaluating`,
`checkpointing`, then `finished` or `failed` (from `summary.json`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from fedml_moon.run_folder import RunFolder, read_json, read_records, write_json

PUBLISH_EVERY_S = 1.0
"""A server or silo rewrites its status.json at most this often, but at once when its phase changes."""
PHASES = {  # the server's own phase names -> what `status` says
    "hello": "waiting for sites",
    "ready": "waiting for sites",
    "train": "training",
    "keys": "secure summing",
    "share": "secure summing",
    "mask": "secure summing",
    "unmask": "secure summing",
    "eval": "evaluating",
    "newtest": "evaluating",
    "checkpoint": "checkpointing",
    "finish": "finishing",
    "done": "finishing",
}
BARS = " ▁▂▃▄▅▆▇█"
CURVE_WIDTH = 60


def write(out_dir: Path, fields: dict[str, Any]) -> None:
    """Replace `out_dir/status.json` with `fields` and the time it was written, at once."""
    fields = {**fields, "updated": time.time()}
    write_json(RunFolder(out_dir).status, fields, indent=1, allow_nan=False)


def starting(run_dir: Path) -> dict[str, Any]:
    """The status of a run whose server has written nothing yet (its first moments)."""
    return {
        "run": Path(run_dir).resolve().name,
        "phase": "waiting for sites",
        "round": 0,
        "rounds": None,
        "sites": [],
        "rounds_completed": 0,
        "latest": None,
        "curve": [],
        "round_time_s": None,
        "eta_s": None,
        "written_s_ago": None,
    }


def read(run_dir: Path, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The run's status: `status.json` joined with its records (module docstring; `rows`: its records
    already read, `layout.read_records(run_dir)`). Raises FileNotFoundError naming the folder when it
    holds no run."""
    run_dir = Path(run_dir)
    rows = read_records(run_dir) if rows is None else rows
    folder = RunFolder(run_dir)
    live, summary = read_json(folder.status, None), read_json(folder.summary, None)
    if live is None and summary is None and not rows:
        raise FileNotFoundError(
            f"{run_dir} holds no run (no status.json, metrics.jsonl or summary.json): give the "
            "folder a run writes to (its --output-dir)"
        )
    status: dict[str, Any] = dict(live or {})
    config = (summary or {}).get("config") or {}
    status.setdefault("run", run_dir.resolve().name)
    status.setdefault("algorithm", config.get("train_args", {}).get("algorithm"))
    status.setdefault("rounds", config.get("train_args", {}).get("comm_round"))
    status.setdefault("sites", [])
    now = time.time()
    for site in status["sites"]:
        heard = site.get("heard_at")
        site["last_heard_s"] = max(0.0, now - heard) if isinstance(heard, (int, float)) else None
    updated = status.get("updated")
    status["written_s_ago"] = max(0.0, now - updated) if isinstance(updated, (int, float)) else None
    done = len({r["round"] for r in rows}) if rows else status.get("site", {}).get("rounds", 0)
    status["rounds_completed"] = done
    if summary is not None and summary.get("status") is not None:
        status["phase"] = "finished" if summary["status"] == "completed" else summary["status"]
    status.setdefault("phase", "training" if rows else "waiting for sites")
    status.setdefault("round", done)
    evaluated = [r for r in rows if r.get("test_acc") is not None]
    status["latest"] = (
        {k: evaluated[-1].get(k) for k in ("round", "test_acc", "test_loss")} if evaluated else None
    )
    status["curve"] = [[r["round"], r["test_acc"]] for r in evaluated]
    spent = [r for r in rows if r.get("dp_epsilon_release") is not None]
    status["dp_epsilon"] = {k: spent[-1].get(k) for k in EPSILONS} if spent else None
    status.setdefault("dp_scope", (summary or {}).get("dp_scope"))
    running = status["phase"] not in ("finished", "failed", "stopped", "interrupted")
    if rows:  # a silo's folder holds none: its own pace and estimate are in status.json
        times = [r["round_time_s"] for r in rows[-10:] if isinstance(r.get("round_time_s"), (int, float))]
        status["round_time_s"] = sum(times) / len(times) if times else None
        left = (status["rounds"] or 0) - done
        status["eta_s"] = left * status["round_time_s"] if times and left > 0 else None
    if not running:
        status["eta_s"] = None
    status.setdefault("round_time_s", None)
    status.setdefault("eta_s", None)
    server = status.get("server")
    if isinstance(server, dict):
        heard = server.get("heard_at")
        server["last_heard_s"] = max(0.0, now - heard) if isinstance(heard, (int, float)) else None
    return status


def sparkline(values: list[float], width: int = CURVE_WIDTH) -> str:
    """`values` as one line of block characters (the last `width`), lowest to highest."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)][-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low or 1.0
    return "".join(BARS[1 + round((v - low) / span * (len(BARS) - 2))] for v in values)


def ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"


def round_of(status: dict[str, Any]) -> str:
    """`round r of R (from 0)`: numbered from 0, as metrics.jsonl, the metrics, TensorBoard and W&B
    number them (at most R - 1)."""
    rounds, index = status.get("rounds"), status.get("round") or 0
    shown = min(index, rounds - 1) if rounds else index
    return f"round {shown}" + (f" of {rounds}" if rounds else "") + " (from 0)"


EPSILONS = ("dp_epsilon_release", "dp_epsilon_sample_known", "dp_epsilon_server")


def privacy_lines(status: dict[str, Any]) -> list[str]:
    """A DP run's epsilons, each with the observers it holds against, and what they do not cover
    (summary.json's `dp_scope`, `privacy/scope.py`); none without DP."""
    spent, scope = status.get("dp_epsilon") or {}, status.get("dp_scope") or {}
    if not spent and not scope:
        return []
    against = scope.get("epsilon_against") or {}
    lines = []
    for key in EPSILONS:
        value = spent.get(key)
        figure = f"{value:.2f}" if isinstance(value, (int, float)) else "none" if key in spent else "-"
        lines.append(f"DP {key.removeprefix('dp_')} {figure}: against {against.get(key, '?')}")
    if scope.get("not_covered"):
        lines.append("not covered by epsilon: " + "; ".join(scope["not_covered"]))
    return lines


def site_state(site: dict[str, Any]) -> str:
    """`connected`, `gone` (heard, then no more), or `not yet connected` (never heard)."""
    if site.get("connected"):
        return "connected"
    return "gone" if site.get("heard_at") is not None else "not yet connected"


def render(status: dict[str, Any]) -> str:
    """The status as lines of text, for a terminal."""
    written = status.get("written_s_ago")
    notes = (
        [] if "site" in status else [f"{status['rounds_completed']} rounds recorded"]
    )  # a silo records none
    notes += [f"status written {written:.0f} s ago"] if written is not None else []
    lines = [
        f"run {status['run']}: {status.get('algorithm') or '?'}, {round_of(status)}, "
        f"{status['phase']} ({'; '.join(notes)})"
    ]
    latest = status.get("latest")
    if latest:
        acc, loss = latest["test_acc"], latest["test_loss"]
        lines.append(f"test accuracy {acc:.4f}, loss {loss:.4f} (round {latest['round']})")
        curve = [acc for _, acc in status["curve"]]
        lines.append(f"test accuracy {min(curve):.3f} {sparkline(curve)} {max(curve):.3f}")
    if status.get("round_time_s") is not None:
        end = f", done in about {status['eta_s']:.0f} s" if status.get("eta_s") else ""
        lines.append(f"round time {status['round_time_s']:.1f} s{end}")
    lines += privacy_lines(status)
    server, site = status.get("server"), status.get("site")
    if isinstance(server, dict) and isinstance(site, dict):  # a silo's own status
        state = "connected" if server.get("connected") else "not connected"
        lines.append(
            f"site rank {site['rank']}: trained {site.get('rounds', 0)} rounds; the server: {state}, "
            f"last heard {ago(server.get('last_heard_s'))}"
        )
    for site in status.get("sites", []):
        state = site_state(site)
        heard = "" if state == "not yet connected" else f", last heard {ago(site.get('last_heard_s'))}"
        lines.append(
            f"site rank {site['rank']}: {state}{heard}, {site.get('rounds', 0)} rounds taken part in, "
            f"{site.get('refused', 0)} messages refused"
        )
    return "\n".join(lines) + "\n"
