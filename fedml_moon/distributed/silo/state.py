"""A silo's (or an MPI simulation worker's) state, in one place: what it knows before the server
welcomes it (`Local`), what it builds from the run's config (`Built`), and where it stands with its
server (`SiloState`), which the manager hands to its members (the secure sums' party side, the
status it publishes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fedml_moon.config.load import Config
from fedml_moon.engine.parties import PartyRunner
from fedml_moon.engine.resume import Holding


@dataclass
class Built:
    """What a worker builds from the run's config: its parties' runner, their ids, the shared config
    (dotted keys) and the whole config it runs with (its own settings with the shared ones)."""

    runner: PartyRunner
    parties: list[int]
    config: dict
    run_config: Config
    claims: dict[int, dict]  # party -> what it holds (engine.claims): said in READY
    data_sha256: str = ""  # what it read (silo/refusal.py's data digest): kept in its folder, never sent

    def holding(self) -> Holding:
        """What it checkpoints and restores: its parties."""
        return Holding(runner=self.runner, parties=self.parties)


@dataclass
class Local:
    """What a worker knows before the server welcomes it: its own config's shared settings, the keys it
    set itself (`--set`), the parties it expects to hold and those without stored state."""

    config: dict
    explicit: list[str]
    parties: list[int]
    fresh: Callable[[], list[int]]
    overwrite: bool = False  # --overwrite: a new run, whatever data this site read in an earlier one


@dataclass
class SiloState:
    """Where the silo stands: its parties once built, whether a server welcomed it and which
    (`session`, the digest of the config it gave), whether it trained since, what it waits for and
    since when, the rounds it trained, and why it stopped."""

    built: Built | None = None
    welcomed: bool = False
    session: str | None = None
    digest: str | None = None
    trained_since_welcome: bool = False
    trained: int = 0  # TRAIN tasks it trained
    said_hello: bool = False
    last_hello: float = 0.0
    waiting_since: float = field(default_factory=time.monotonic)
    last_wait_log: float = field(default_factory=time.monotonic)
    data_recorded: bool = False  # its data's digest is written in its folder (from its first task on)
    stopped: bool = False
    reason: str = ""
