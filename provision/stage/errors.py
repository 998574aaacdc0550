"""The one error staging raises for a problem a person can fix."""

from __future__ import annotations


class StageError(Exception):
    """Staging cannot go on: a problem and how to fix it (gpubox turns it into exit 2)."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem, self.fix = problem, fix
