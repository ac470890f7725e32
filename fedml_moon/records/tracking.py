"""Weights & Biases: offline by default, online when the user has logged in. Never sends secrets."""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from typing import Any

from fedml_moon.run_folder import RunFolder

log = logging.getLogger(__name__)

_SECRET_WORDS = ("key", "token", "secret", "password")


def scrub(config: Any) -> Any:
    """Drop every entry whose name looks like a credential, at any depth."""
    if isinstance(config, dict):
        return {k: scrub(v) for k, v in config.items() if not any(w in str(k).lower() for w in _SECRET_WORDS)}
    return config


def logged_in() -> bool:
    """True when W&B credentials exist (WANDB_API_KEY, or an api.wandb.ai entry in ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str) -> str:
    """'auto' becomes 'online' when logged in, else 'offline'; WANDB_MODE in the environment wins."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if mode == "auto":
        return "online" if logged_in() else "offline"
    return mode


class WandbRun:
    """A thin wrapper: per-round metrics keyed by round, with a `round` field as well."""

    def __init__(
        self, project: str, entity: str | None, name: str, mode: str, out_dir: Path, config: dict
    ) -> None:
        import wandb

        self.mode = resolve_mode(mode)
        self._wandb = wandb
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            mode=self.mode,
            dir=str(out_dir),
            config=scrub(config),
            reinit=True,
        )
        log.info("W&B run %s (%s); files under %s", name, self.mode, RunFolder(out_dir).wandb)

    def log(self, metrics: dict[str, Any], round_idx: int) -> None:
        self.run.log({**metrics, "round": round_idx}, step=round_idx)

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str)):
                self.run.summary[key] = value
        self.run.finish()
        if self.mode == "offline":
            log.info("W&B ran offline; upload later with: wandb sync %s", Path(self.run.dir).parent)


def scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A round's record as TensorBoard scalars: its numbers (not `round`, the step), those of a nested
    record as `field/key` (e.g. `party_test/3`); strings, lists and booleans left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{tag}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and tag != "round":
            out[tag] = float(value)
    return out


class TensorBoardRun:
    """The round records as TensorBoard event files under `out_dir/tensorboard`, one step a round.

    A resumed run writes its new rounds from the checkpoint's next one (`resume_after`): the events
    an interrupted run wrote past its checkpoint are purged (TensorBoard's `purge_step`), so the
    curves read as one run, as metrics.jsonl does."""

    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._writer_class = SummaryWriter
        self.folder = RunFolder(out_dir).tensorboard
        self._writer: Any = None
        self._purge_step: int | None = None

    def resume_after(self, last_round: int) -> None:
        """The run goes on after round `last_round` (its checkpoint's last record; -1: none)."""
        self._purge_step = last_round + 1

    def log(self, metrics: dict[str, Any], round_idx: int) -> None:
        if self._writer is None:
            self._writer = self._writer_class(str(self.folder), purge_step=self._purge_step)
            log.info("TensorBoard event files under %s (tensorboard --logdir %s)", self.folder, self.folder)
        for tag, value in scalars(metrics).items():
            self._writer.add_scalar(tag, value, round_idx)
        self._writer.flush()  # each round readable as soon as it is recorded

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
