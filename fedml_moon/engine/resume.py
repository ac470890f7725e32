"""When to checkpoint, what a checkpoint must agree on, and where it lives (`<output>/checkpoint/`).

A run resumed with `--resume DIR` must have the config its checkpoint was written with, except for
settings that do not change what is computed (W&B, device and threads, network addresses and
timeouts, the checkpoint interval); anything else is refused with the differing keys named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fedml_moon.config import Config, config_to_dict
from fedml_moon.config_schema import SECTIONS, ConfigError
from fedml_moon.core.checkpoint import latest, read_checkpoint

CHECKPOINT_DIR = "checkpoint"
FREE_PREFIXES = ("tracking_args.", "device_args.", "comm_args.")  # how and where, not what
FREE_KEYS = {"train_args.checkpoint_every", "data_args.data_cache_dir", "data_args.download"}
BOUND_KEYS = {"comm_args.backend"}  # a checkpoint belongs to one mode


def checkpoint_root(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR


def due(every: int, round_idx: int, rounds: int) -> bool:
    """Checkpoint after this round: every `every` rounds (0: never in between) and after the last."""
    return round_idx == rounds - 1 or (every > 0 and (round_idx + 1) % every == 0)


def flatten(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{section: {key: value}} -> {"section.key": value}."""
    return {f"{section}.{key}": value for section, values in config.items() for key, value in values.items()}


def flat_config(cfg: Config) -> dict[str, Any]:
    return flatten(config_to_dict(cfg))


def check_config(saved: dict[str, Any], cfg: Config, where: Path) -> None:
    """Refuse to resume with a config that would compute something else; name the keys."""
    now = flat_config(cfg)
    differing = []
    for key in sorted(set(saved) | set(now)):
        free = key in FREE_KEYS or (key.startswith(FREE_PREFIXES) and key not in BOUND_KEYS)
        if key not in saved and key in now and now[key] == _default(key):
            continue  # a setting newer than the checkpoint, at its default: what the run computed
        if not free and saved.get(key) != now.get(key):
            differing.append(f"{key} ({saved.get(key)!r} in the checkpoint, {now.get(key)!r} now)")
    if differing:
        raise ConfigError(
            f"--resume {where}: the checkpoint was written with another config: {'; '.join(differing)}. "
            "Resume with the config of the run (the same --cf and --set), or start a new run"
        )


_NO_DEFAULT = object()


def _default(key: str) -> Any:
    """The schema's default of a dotted key ("server_args.robust_aggregation"), or `_NO_DEFAULT`."""
    section, _, name = key.partition(".")
    fields = dataclasses.fields(SECTIONS[section]) if section in SECTIONS else ()
    field = next((f for f in fields if f.name == name), None)
    return _NO_DEFAULT if field is None or field.default is dataclasses.MISSING else field.default


def resume_round(out_dir: Path) -> int:
    """The round of the newest complete checkpoint under `out_dir`; a ConfigError when there is none."""
    found = latest(checkpoint_root(out_dir))
    if found is None:
        raise ConfigError(
            f"--resume {out_dir}: no checkpoint there ({checkpoint_root(out_dir)}/LATEST is missing); "
            "give the output directory of a run that wrote one (train_args.checkpoint_every)"
        )
    return found


def check_resumable(out_dir: Path, cfg: Config) -> int:
    """Whether the run in `out_dir` can go on with `cfg`, decided before anything of it is built or
    written: the round of its newest checkpoint, whose saved config (its `config` part, the same in
    the standalone and the distributed server's checkpoints) `check_config` accepts; else a
    ConfigError (no checkpoint; the keys that differ) and nothing in `out_dir` has changed."""
    round_idx = resume_round(out_dir)
    saved = read_checkpoint(checkpoint_root(out_dir), round_idx, ("config",))["config"]
    check_config(saved, cfg, out_dir)
    return round_idx
