"""When to checkpoint, what a checkpoint holds and must agree on, and where it lives.

One layout and one resume path for every mode. Each process of a run writes, under its own folder's
`checkpoint/` (`core.checkpoint`: `round-<r>/`, `LATEST`), the parts it holds (`Holding`): always
`config` (its flat config), `server` where it runs the server's side (`ServerRounds.state`),
`parties` where it trains parties (each party's state and loader stream, by party id) and
`best_so_far` where it keeps party figures. The standalone simulation holds all of them in one
folder; a distributed server `config` and `server`, a worker or silo `config` and its `parties`
(in `<output>/rank-<k>/checkpoint/`). `save` writes them and `restore` reads and loads them, in
every mode.

A run resumed with `--resume DIR` must have the config its checkpoint was written with, except for
settings that do not change what is computed (W&B, device and threads, network addresses and
timeouts, the checkpoint interval); anything else is refused with the differing keys named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedml_moon.config.files import DIGEST_KEYS, file_digests
from fedml_moon.config.load import Config, config_to_dict
from fedml_moon.config.schema import SECTIONS, ConfigError
from fedml_moon.core.checkpoint import latest, read_checkpoint, write_checkpoint
from fedml_moon.core.personal import PartyFigures
from fedml_moon.run_folder import RunFolder

if TYPE_CHECKING:
    from fedml_moon.engine.parties import PartyRunner
    from fedml_moon.engine.rounds import ServerRounds

FREE_PREFIXES = ("tracking_args.", "device_args.", "comm_args.")  # how and where, not what
FREE_KEYS = {
    "train_args.checkpoint_every",
    "train_args.state_store",  # where a process keeps party states; the checkpoint holds them either way
    "data_args.data_cache_dir",
    "data_args.download",
    "data_args.plugin",  # where a site's data reader comes from (what it reads is its data's business)
    "common_args.plugins",  # where the algorithm comes from; its name is bound
}
BOUND_KEYS = {"comm_args.backend"}  # a checkpoint belongs to one mode


def checkpoint_root(out_dir: Path) -> Path:
    """The checkpoints' folder of the process whose run folder is `out_dir`."""
    return RunFolder(out_dir).checkpoints


def due(every: int, round_idx: int, rounds: int) -> bool:
    """Checkpoint after this round: every `every` rounds (0: never in between) and after the last."""
    return round_idx == rounds - 1 or (every > 0 and (round_idx + 1) % every == 0)


def flatten(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{section: {key: value}} -> {"section.key": value}."""
    return {f"{section}.{key}": value for section, values in config.items() for key, value in values.items()}


def flat_config(cfg: Config) -> dict[str, Any]:
    """The config as dotted keys, with the digest of each file a setting names (`file_digests`)."""
    flat = flatten(config_to_dict(cfg))
    flat.update(file_digests(flat))
    return flat


def check_config(
    saved: dict[str, Any], cfg: Config, where: Path, only: Collection[str] | None = None
) -> None:
    """Refuse to resume with a config that would compute something else; name the keys. `only`: the
    keys that decide what this process computes (a worker's: the run's shared settings, and then the
    message speaks to the worker's operator)."""
    now = flat_config(cfg)
    differing = []
    keys = set(saved) | set(now) if only is None else set(only)
    for key in sorted(keys):
        free = key in FREE_KEYS or (key.startswith(FREE_PREFIXES) and key not in BOUND_KEYS)
        if key not in saved and key in now and (now[key] == _default(key) or key in DIGEST_KEYS):
            continue  # a setting newer than the checkpoint, at its default (or a file's digest it lacks)
        if not free and saved.get(key) != now.get(key):
            differing.append(f"{key} ({saved.get(key)!r} in the checkpoint, {now.get(key)!r} now)")
    if not differing:
        return
    if only is not None:
        raise ConfigError(
            f"this worker's checkpoint in {where} was written with another config than the run's: "
            f"{'; '.join(differing)}. The server resumes the run with its config; restart the server "
            "with the run's --cf and --set, or start a new run (a fresh output folder)"
        )
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
            f"--resume {out_dir}: no checkpoint there ({RunFolder(out_dir).latest} is missing); "
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


@dataclass
class Holding:
    """What one process of a run holds, and so checkpoints and restores: the server's side, parties
    (the standalone simulation: all; a worker: its own) and party figures; None where it holds none."""

    server: ServerRounds | None = None
    runner: PartyRunner | None = None
    parties: list[int] = field(default_factory=list)
    figures: PartyFigures | None = None

    def names(self) -> tuple[str, ...]:
        """The checkpoint parts it writes and reads."""
        held = {"server": self.server, "parties": self.runner, "best_so_far": self.figures}
        return ("config", *(name for name, part in held.items() if part is not None))


def save(folder: Path, round_idx: int, config: dict[str, Any], held: Holding, keep: int = 1) -> Path:
    """The checkpoint of `round_idx` of the process whose run folder is `folder`: `config` (its flat
    config) and the parts `held` names; returns the checkpoint's folder."""
    parts: dict[str, Any] = {"config": config}
    if held.server is not None:
        parts["server"] = held.server.state(round_idx)
    if held.runner is not None:
        parts["parties"] = held.runner.state_pieces(held.parties)
    if held.figures is not None:
        parts["best_so_far"] = {"best": held.figures.state()}
    return write_checkpoint(checkpoint_root(folder), round_idx, parts, keep)


def restore(
    folder: Path, round_idx: int, held: Holding, check: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """Load the checkpoint of `round_idx` into what `held` names, after `check(saved config)` (which
    raises to refuse it); returns the first round still to run."""
    saved = read_checkpoint(checkpoint_root(folder), round_idx, held.names())
    if check is not None:
        check(saved["config"])
    start = round_idx + 1 if held.server is None else held.server.load_state(saved["server"])
    if held.runner is not None:
        held.runner.load_state(saved["parties"])
    if held.figures is not None:
        held.figures.load_state(saved["best_so_far"]["best"])
    return start
