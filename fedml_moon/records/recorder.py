"""Run records: metrics.jsonl per round (test fields where evaluated), summary.json, status.json (what
the run is doing: `fedml_moon.status.record`), a plot, W&B, TensorBoard."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from fedml_moon.records.folder import replace_earlier
from fedml_moon.records.tracking import TensorBoardRun, WandbRun
from fedml_moon.run_folder import RunFolder, write_text
from fedml_moon.status import record as run_status

log = logging.getLogger(__name__)


class RunRecorder:
    """Writes each record as soon as it exists, so an interrupted run keeps what it computed.

    metrics.jsonl is first written by the first `log_round` (a new run: the file starts empty),
    `restore` (a resumed run: the checkpoint's records) or `finish` (a run that recorded nothing):
    building a recorder changes no file (but for an earlier run's records that `--overwrite` said to
    replace), so a run refused before it starts leaves the records of the run before it as they were."""

    def __init__(
        self,
        out_dir: Path,
        config: dict[str, Any],
        wandb_run: WandbRun | None = None,
        tensorboard: TensorBoardRun | None = None,
        plots: bool = True,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.folder = RunFolder(self.out_dir)
        self.plots = plots  # accuracy.png as the run ends (tracking_args.plots)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        replace_earlier(self.out_dir)  # --overwrite: the earlier run's records go as this run starts
        self.config = config
        self.wandb = wandb_run
        self.tensorboard = tensorboard
        self.records: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.metrics_path = self.folder.metrics
        self._written = False  # whether metrics.jsonl holds this run's records yet
        self.live: dict[str, Any] = {}  # what status.json says beside the run's name, algorithm, rounds

    def publish(self, **fields: Any) -> None:
        """Rewrite status.json with `fields` (kept for the next writes too): the round in progress
        (as metrics.jsonl numbers rounds), its phase and, from a distributed run's server, its sites."""
        self.live.update(fields)
        train = self.config.get("train_args", {})
        head = {"run": self.out_dir.resolve().name, "algorithm": train.get("algorithm")}
        try:
            run_status.write(self.out_dir, {**head, "rounds": train.get("comm_round"), **self.live})
        except (OSError, ValueError) as err:  # a status file must never cost the run its records
            log.warning("could not write %s: %s", self.folder.status, err)

    def _rewrite(self) -> None:
        """metrics.jsonl := exactly `records` (from here on, records are appended)."""
        self.metrics_path.write_text("".join(json_line(r) + "\n" for r in self.records))
        self._written = True

    def log_round(self, record: dict[str, Any]) -> None:
        """Append one round's record (every round; test fields only where evaluated) and log it."""
        self.records.append(record)
        if not self._written:
            self._rewrite()
        else:
            with self.metrics_path.open("a") as fh:
                fh.write(json_line(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != "round"}, record["round"])
        if self.tensorboard is not None:
            self.tensorboard.log(record, record["round"])
        self.publish(round=record["round"] + 1, phase=self.live.get("phase", "training"))
        test = (
            f"test_acc {record['test_acc']:.4f} test_loss {record['test_loss']:.4f} "
            if "test_acc" in record
            else ""
        )
        train = record.get("train_loss")
        log.info(
            "round %d: %strain_loss %s (%.1f s)",
            record["round"],
            test,
            f"{train:.4f}" if train is not None else "n/a",
            record.get("round_time_s", 0.0),
        )

    def restore(self, records: list[dict[str, Any]]) -> None:
        """Start again from a checkpoint: metrics.jsonl holds exactly `records` (rounds recorded after
        the checkpoint, before a crash, are dropped; they are computed again)."""
        self.records = [dict(r) for r in records]
        self._rewrite()
        if self.tensorboard is not None:
            self.tensorboard.resume_after(self.records[-1]["round"] if self.records else -1)

    def summary(self, status: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        evaluated = [r for r in self.records if "test_acc" in r]
        best = max(evaluated, key=lambda r: r["test_acc"], default=None)
        out: dict[str, Any] = {
            "status": status,
            "rounds_completed": len({r["round"] for r in self.records}),
            "final_test_acc": evaluated[-1]["test_acc"] if evaluated else None,
            "final_round": evaluated[-1]["round"] if evaluated else None,
            "best_test_acc": best["test_acc"] if best else None,
            "best_round": best["round"] if best else None,
            "total_time_s": time.perf_counter() - self.started,
        }
        if evaluated and "test_acc_std" in evaluated[-1]:
            out["final_test_acc_std"] = evaluated[-1]["test_acc_std"]
        reported = [r for r in evaluated if "local_test_acc_best_so_far" in r]
        if reported:  # LG-FedAvg's report_best: the authors' figure is the round where it peaks
            peak = max(reported, key=lambda r: r["local_test_acc_best_so_far"])
            out["reported_round"] = peak["round"]
            out["reported_local_test_acc"] = peak["local_test_acc_best_so_far"]
            out["reported_new_test_acc"] = peak["new_test_acc_best_so_far"]
        out.update(extra or {})
        out["config"] = self.config
        return out

    def finish(self, status: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        if not self._written:  # nothing recorded: metrics.jsonl says so too
            self._rewrite()
        summary = self.summary(status, extra)
        write_text(self.folder.summary, json_line(summary, indent=2))
        self.publish(phase="finished" if status == "completed" else status)
        try:
            if self.plots:
                self.plot(self.folder.accuracy_plot)
        except Exception:  # a plot must never cost the run its summary
            log.exception("could not draw the accuracy plot")
        if self.tensorboard is not None:
            self.tensorboard.finish()
        if self.wandb is not None:
            self.wandb.finish({k: v for k, v in summary.items() if k != "config"})
        return summary

    def plot(self, path: Path) -> Path | None:
        evaluated = [r for r in self.records if "test_acc" in r]
        if not evaluated:
            return None
        from fedml_moon.data.plot import figure  # matplotlib's Figure on Agg, without pyplot

        fig = figure((6.0, 4.0))
        ax = fig.add_subplot()
        ax.plot([r["round"] for r in evaluated], [100 * r["test_acc"] for r in evaluated], marker=".")
        algo = self.config.get("train_args", {}).get("algorithm", "")
        data = self.config.get("data_args", {}).get("dataset", "")
        ax.set(xlabel="round", ylabel="test accuracy (%)", title=f"{algo} on {data}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return path


def json_line(value: Any, indent: int | None = None) -> str:
    """`value` as JSON that every reader takes: a number that is not finite (a diverged evaluation)
    is written as null, and a warning names its field (JSON has no NaN)."""
    bad: list[str] = []

    def finite(v: Any, path: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            bad.append(path)
            return None
        if isinstance(v, dict):
            return {k: finite(x, f"{path}.{k}" if path else str(k)) for k, x in v.items()}
        if isinstance(v, list):
            return [finite(x, f"{path}[{i}]") for i, x in enumerate(v)]
        return v

    text = json.dumps(finite(value, ""), indent=indent, allow_nan=False)
    if bad:
        log.warning("not finite, written as null: %s", ", ".join(bad[:10]))
    return text
