"""Weights & Biases: offline by default, online when the user has logged in. Never sends secrets."""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from typing import Any

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
        log.info("W&B run %s (%s); files under %s", name, self.mode, out_dir / "wandb")

    def log(self, metrics: dict[str, Any], round_idx: int) -> None:
        self.run.log({**metrics, "round": round_idx}, step=round_idx)

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str)):
                self.run.summary[key] = value
        self.run.finish()
        if self.mode == "offline":
            log.info("W&B ran offline; upload later with: wandb sync %s", Path(self.run.dir).parent)
