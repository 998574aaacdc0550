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


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during a run of steps: carries what had ended by then (`results`, the
    StepResults in order) and the steps still running, so the CLI can say what was already
    changed before it exits 130."""

    def __init__(self, results=(), running=()):
        super().__init__()
        self.results = list(results)
        self.running = list(running)

    def summary(self) -> list[str]:
        """Lines for people: each change made, then what was cut short."""
        changed = [r for r in self.results if getattr(r, "changed", False)]
        out = [f"already changed: {r.name} ({r.host}): {r.detail}" for r in changed]
        if not changed:
            out.append("nothing was changed")
        out += [f"interrupted while running: {n}" for n in self.running]
        return out


class InventoryError(GpuboxError):
    """The inventory cannot be read or does not describe the box asked for."""


class BadInput(GpuboxError):
    """Bad input that only the box can show (an `--include` BDF the host does not have): raised
    by a step's facts, it ends the run as bad input (exit 2) like a bad option, instead of being
    one failed step. Options that need no reading are checked by `Step.options`, before this."""


class TransportError(GpuboxError):
    """A host cannot be reached, or a command could not be started on it."""


class CommandError(GpuboxError):
    """A command ran and failed where success was required."""

    def __init__(self, argv, rc, stderr, host=""):
        where = f" on {host}" if host else ""
        tail = (stderr or "").strip().splitlines()[-1:] or [""]
        super().__init__(f"`{' '.join(map(str, argv))}` exited {rc}{where}: {tail[0]}".rstrip(": "))
        self.argv, self.rc, self.stderr = list(argv), rc, stderr


def not_utf8(what: str, data: bytes, exc: UnicodeDecodeError) -> GpuboxError:
    """The one-line cause for bytes that are not UTF-8 text, with where they are."""
    line = data.count(b"\n", 0, exc.start) + 1
    return GpuboxError(
        f"{what} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line})",
        "re-save it as UTF-8 (iconv -t UTF-8), or fix the bytes",
    )


_OS_FIX = {
    "EROFS": "the file system is read-only: remount it read-write or choose another path",
    "EPERM": "the file may be immutable (lsattr; chattr -i) or the operation needs root",
    "EACCES": "run with the rights to that path (root?), or choose another path",
    "ENOSPC": "free space on that file system and re-run (nothing was half-written)",
    "EDQUOT": "free space within the quota and re-run",
    "ENOTDIR": "a file stands where a directory is needed: move it away",
    "EEXIST": "something else already stands at that path: move it away",
    "EISDIR": "a directory stands where a file is needed: move it away",
    "ENAMETOOLONG": "a path component is too long: use a shorter name",
    "ENOENT": "check the path",
    "ELOOP": "too many symlinks: check the path",
}


def os_error(exc: OSError) -> GpuboxError:
    """An OSError as the one-line cause and fix (errno name, strerror, the path)."""
    import errno as _errno

    name = _errno.errorcode.get(exc.errno or 0, "OSError")
    where = f" {exc.filename}" if exc.filename else ""
    if getattr(exc, "filename2", None):
        where += f" -> {exc.filename2}"
    msg = f"cannot use{where}: {exc.strerror or exc} [{name}]"
    return GpuboxError(msg, _OS_FIX.get(name, "check the path and its permissions"))
