"""The one interface every transport offers: run an argv, read, write atomically, stat."""

from __future__ import annotations

import stat as _stat
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..errors import CommandError, TransportError


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


def idle_error(argv: Sequence[str], idle: float, where: str) -> TransportError:
    """The one wording for a command ended by its idle deadline (every transport)."""
    return TransportError(
        f"`{' '.join(argv)}` said nothing for {idle:g} s on {where} and was ended",
        "check what it waits for (a hung mount, a stopped process) and re-run",
    )


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
        self.last = time.monotonic()  # when the stream last said anything (the idle deadline)

    def feed(self, data: bytes) -> None:
        self.last = time.monotonic()
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
    # The host's root prefix (gpubox_root; set by gpubox.host.Host): the anchor every local write
    # is made beneath, with no link followed (gpubox.safepath).
    root: str = "/"

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
        idle: float | None = None,
    ) -> CmdResult:
        """Run argv and collect its output. `on_stderr` gets each stderr line while the command
        runs (it is in the result's stderr as well). `idle`: the command is ended (TransportError)
        when its stderr says nothing for that many seconds, long before `timeout`: a remote that
        reports progress every second and then falls silent is hung, not slow."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Whole file; FileNotFoundError when absent."""

    @abstractmethod
    def write_bytes_atomic(
        self, path: str, data: bytes, mode: int | None = None, tmp_name: str | None = None
    ) -> None:
        """Write to a temporary file in the same directory, flush, rename over `path`.

        `tmp_name` overrides the temporary's basename (Proxmox's own `<file>.tmp.<pid>`)."""

    def refuse_links(self, path: str) -> None:
        """Refuse PATH when any existing component of it is a symbolic link (the remote side's
        `realpath -m` against the canonical spelling: with no link on the way they are equal).
        The local transport needs none of this: it opens beneath a directory fd, no link followed."""
        from ..safepath import LINK_WHY, Refused, canonical, system_link_ok

        want = canonical(path)
        r = self.run(["realpath", "-m", "--", want])
        if r.rc != 0:
            return  # no realpath there (busybox without -m): the rename still never follows one
        got = r.stdout.strip()
        if got and got != want and not system_link_ok(want, got, self.root):
            raise Refused(want, f"leads to {got}: a component {LINK_WHY[5:]}")

    def read_bounded(self, path: str, limit: int) -> bytes:
        """A file others could have written: a regular file (lstat first: a FIFO, device or link
        is refused before it is opened, so nothing blocks) of at most LIMIT bytes."""
        from ..safepath import LINK_WHY, Refused

        st = self.stat(path)
        if st is None:
            raise FileNotFoundError(path)
        if _stat.S_ISLNK(st.mode):
            raise Refused(path, LINK_WHY)
        if not st.is_file:
            raise Refused(
                path, "is not a regular file", "gpubox reads only regular files there; move it away"
            )
        if st.size > limit:
            raise Refused(
                path, f"is larger than {limit} bytes", "it is not a file gpubox wrote; move it away"
            )
        data = self.read_bytes(path)
        if len(data) > limit:
            raise Refused(
                path, f"is larger than {limit} bytes", "it is not a file gpubox wrote; move it away"
            )
        return data

    @abstractmethod
    def stat(self, path: str) -> FileStat | None:
        """lstat-like facts, or None when the path does not exist."""

    @abstractmethod
    def listdir(self, path: str) -> list[str]: ...

    @abstractmethod
    def makedirs(self, path: str, mode: int = 0o755) -> None: ...

    @abstractmethod
    def remove(self, path: str) -> None: ...

    def hold(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> "Held":
        """Start ARGV and keep it running with stdin open (see Held); the box lock uses it."""
        raise hold_unsupported(self.name)

    def close(self) -> None:  # noqa: B027 - an optional hook: most transports hold nothing to close
        """Release connections (no-op by default)."""

    @property
    def is_local(self) -> bool:
        return False


class Held:
    """A long-running command on a host whose life is the point (a `flock` that holds a lock while
    its `cat` waits on stdin). It ends when we close its stdin (`release`), and also when this
    process dies however it dies: the pipe or SSH channel closes, `cat` reads EOF, flock exits
    and the kernel drops the lock. Subclasses give `_read`, `_close_stdin`, `_poll`, `_kill`."""

    def __init__(self) -> None:
        import queue

        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)

    def _start(self) -> None:
        self._reader.start()

    def _pump(self) -> None:
        buf = b""
        while True:
            try:
                b = self._read()
            except Exception:  # noqa: BLE001 - a broken pipe/channel ends the stream, nothing more
                b = b""
            if not b:
                break
            buf += b
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._lines.put(line.decode(errors="replace"))
        if buf:
            self._lines.put(buf.decode(errors="replace"))
        self._lines.put(None)

    def first_line(self, timeout: float) -> str | None:
        """The command's first stdout line, or None when it ended (or TIMEOUT passed) without one."""
        import queue

        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def release(self, timeout: float = 10) -> int | None:
        """Close stdin and wait for the command to end; its exit status (None if it had to be killed)."""
        try:
            self._close_stdin()
        except Exception:  # noqa: BLE001 - already gone
            pass
        rc = self.wait(timeout)
        if rc is None:
            self._kill()
        return rc

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self._poll()
            if rc is not None:
                return rc
            time.sleep(0.02)
        return None

    def stderr_text(self) -> str:
        return ""

    def _read(self) -> bytes:
        raise NotImplementedError

    def _close_stdin(self) -> None:
        raise NotImplementedError

    def _poll(self) -> int | None:
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError


def hold_unsupported(name: str):
    from ..errors import TransportError

    return TransportError(f"{name}: this connection cannot hold a command open", "use local, ssh or pct")
