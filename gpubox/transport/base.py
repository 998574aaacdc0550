"""The one interface every transport offers: run an argv, read, write atomically, stat."""

from __future__ import annotations

import stat as _stat
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..errors import CommandError


@dataclass
class CmdResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float = 0.0
    host: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def check(self) -> "CmdResult":
        """Raise CommandError unless the command succeeded."""
        if self.rc != 0:
            raise CommandError(self.argv, self.rc, self.stderr or self.stdout, self.host)
        return self


@dataclass
class FileStat:
    path: str
    mode: int
    size: int
    mtime: float
    uid: int = 0
    gid: int = 0
    rdev: tuple[int, int] | None = field(default=None)

    @property
    def is_dir(self) -> bool:
        return _stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return _stat.S_ISREG(self.mode)

    @property
    def is_char_device(self) -> bool:
        return _stat.S_ISCHR(self.mode)

    @property
    def perms(self) -> int:
        return _stat.S_IMODE(self.mode)


def validate_argv(argv: Sequence[str]) -> list[str]:
    """Commands are argv lists, never shell strings: refuse anything else early."""
    if isinstance(argv, (str, bytes)) or not argv:
        raise TypeError("argv must be a non-empty list of strings, not a shell string")
    out = [str(a) for a in argv]
    if any("\x00" in a for a in out):
        raise ValueError("argv element contains a NUL byte")
    return out


LineCallback = Callable[[str], None]


class LineSplitter:
    """Hands each complete line of a byte stream to a callback as soon as it has arrived (the
    remote side's progress lines, shown live while the command still runs). A callback that
    raises is dropped, so a display bug never breaks the command it watches."""

    def __init__(self, callback: LineCallback | None):
        self.callback = callback
        self._buf = b""

    def feed(self, data: bytes) -> None:
        if self.callback is None:
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._emit(line)

    def flush(self) -> None:
        if self._buf:
            self._emit(self._buf)
            self._buf = b""

    def _emit(self, line: bytes) -> None:
        if self.callback is None:
            return
        try:
            self.callback(line.decode(errors="replace").rstrip("\r"))
        except Exception:  # noqa: BLE001 - see the class docstring
            self.callback = None


class Transport(ABC):
    """Run commands and touch files on one host. Paths here are real paths (no root prefix)."""

    name: str = "?"

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        input: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
        on_stderr: LineCallback | None = None,
    ) -> CmdResult:
        """Run argv and collect its output. `on_stderr` gets each stderr line while the command
        runs (it is in the result's stderr as well)."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Whole file; FileNotFoundError when absent."""

    @abstractmethod
    def write_bytes_atomic(
        self, path: str, data: bytes, mode: int | None = None, tmp_name: str | None = None
    ) -> None:
        """Write to a temporary file in the same directory, flush, rename over `path`.

        `tmp_name` overrides the temporary's basename (Proxmox's own `<file>.tmp.<pid>`)."""

    @abstractmethod
    def stat(self, path: str) -> FileStat | None:
        """lstat-like facts, or None when the path does not exist."""

    @abstractmethod
    def listdir(self, path: str) -> list[str]: ...

    @abstractmethod
    def makedirs(self, path: str, mode: int = 0o755) -> None: ...

    @abstractmethod
    def remove(self, path: str) -> None: ...

    def close(self) -> None:  # noqa: B027 - an optional hook: most transports hold nothing to close
        """Release connections (no-op by default)."""

    @property
    def is_local(self) -> bool:
        return False
