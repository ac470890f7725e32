"""The config's error and its one check, shared by every section's validation."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value is wrong. The message names the key and how to fix it."""


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError for `key` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")
