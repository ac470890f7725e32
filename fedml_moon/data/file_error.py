"""The error of a data file that exists but cannot be read (its own module: every reader raises it)."""

from __future__ import annotations

from pathlib import Path


class DataFileError(ValueError):
    """A data file exists but cannot be read (truncated, corrupt, another format). Names the file."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem
