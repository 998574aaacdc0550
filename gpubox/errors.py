"""Errors the CLI turns into a one-line message and exit status 2.

Anything the user can fix (bad inventory, unknown box, unreachable host, invalid value) is a
GpuboxError carrying the problem and the fix; the CLI prints `error: <problem> (<fix>)` and no
traceback unless -v is given.
"""

from __future__ import annotations


class GpuboxError(Exception):
    """Bad input or a condition that stops gpubox from running at all (exit 2)."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:  # one line, always
        msg = self.problem if not self.fix else f"{self.problem} ({self.fix})"
        return " ".join(msg.split("\n"))


class InventoryError(GpuboxError):
    """The inventory cannot be read or does not describe the box asked for."""


class TransportError(GpuboxError):
    """A host cannot be reached, or a command could not be started on it."""


class CommandError(GpuboxError):
    """A command ran and failed where success was required."""

    def __init__(self, argv, rc, stderr, host=""):
        where = f" on {host}" if host else ""
        tail = (stderr or "").strip().splitlines()[-1:] or [""]
        super().__init__(f"`{' '.join(map(str, argv))}` exited {rc}{where}: {tail[0]}".rstrip(": "))
        self.argv, self.rc, self.stderr = list(argv), rc, stderr
