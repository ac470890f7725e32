"""The errors the command line catches (importing this module costs nothing: no torch, no FedML), and
the config's one check, shared by every section's validation."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value is wrong. The message names the key and how to fix it."""


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError for `key` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message says which file and why."""


class BadUpload(RuntimeError):
    """Uploads that cannot be used, with train_args.on_bad_upload: stop (or none usable at all)."""


class SchedulerError(RuntimeError):
    """The scheduler cannot be asked, refused a submission, or another process is submitting."""


class Unreachable(RuntimeError):
    """Another process the command asks (a live run's status port) did not answer, or asked it to wait;
    the message names the address and why."""
