"""Local transport: subprocess with argv lists and a timeout, files through os."""

from __future__ import annotations

import errno
import os
import signal
import stat as _stat
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Mapping, Sequence

from .. import safepath
from ..errors import TransportError
from .base import (
    CmdResult,
    FileStat,
    Held,
    LineCallback,
    LineSplitter,
    Transport,
    idle_error,
    validate_argv,
)
from .fsops import POSIX, FileOps


class _Idle(subprocess.TimeoutExpired):
    """The command's stderr said nothing for its idle limit (Transport.run's `idle`)."""


class LocalTransport(Transport):
    """`ops`: the file calls every file method makes (gpubox.transport.fsops; the kernel's own
    unless a simulated box gives its filesystem rules)."""

    def __init__(self, name: str = "localhost", become: bool = False, ops: FileOps | None = None):
        self.name = name
        self.default_become = become
        self.ops = ops or POSIX

    @property
    def is_local(self) -> bool:
        return True

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
        argv = validate_argv(argv)
        if (become or self.default_become) and os.geteuid() != 0:
            argv = ["sudo", "-n", "--", *argv]
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        data = input.encode() if isinstance(input, str) else input
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError:
            return CmdResult(argv, 127, "", f"{argv[0]}: command not found", time.monotonic() - t0, self.name)
        try:
            if on_stderr is None and idle is None:
                out, err = proc.communicate(data, timeout=timeout)
            else:
                out, err = self._communicate_live(proc, data, timeout, on_stderr, idle)
        except subprocess.TimeoutExpired as expired:
            # Its own session: kill the whole process group, and every descendant that left it
            # (setsid, a daemonising hook: psutil walks the tree while the parent still lives).
            kill_tree(proc.pid)
            # Not communicate(): a grandchild that left the group (setsid, a daemonising hook)
            # may hold the pipes open for ever; the command itself is dead, so stop reading.
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
            if isinstance(expired, _Idle):
                raise idle_error(argv, idle, self.name) from None
            raise TransportError(
                f"`{' '.join(argv)}` timed out after {timeout:g} s on {self.name}",
                "raise the timeout or check what the command waits for",
            ) from None
        return CmdResult(
            argv,
            proc.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            time.monotonic() - t0,
            self.name,
        )

    @staticmethod
    def _communicate_live(
        proc, data: bytes | None, timeout: float, on_stderr: LineCallback | None, idle: float | None = None
    ):
        """communicate(), but stderr lines reach `on_stderr` as they are written, and with IDLE
        the command's silence on stderr is bounded too (_Idle, a TimeoutExpired)."""
        out: list[bytes] = []
        err: list[bytes] = []
        lines = LineSplitter(on_stderr)

        def _feed():
            try:
                if data:
                    proc.stdin.write(data)
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass

        def _read(stream, chunks, splitter=None):
            while True:
                b = stream.read1(65536)
                if not b:
                    break
                chunks.append(b)
                if splitter is not None:
                    splitter.feed(b)
            if splitter is not None:
                splitter.flush()

        threads = [
            threading.Thread(target=_read, args=(proc.stdout, out), daemon=True),
            threading.Thread(target=_read, args=(proc.stderr, err, lines), daemon=True),
        ]
        if proc.stdin is not None:
            threads.append(threading.Thread(target=_feed, daemon=True))
        for th in threads:
            th.start()
        deadline = time.monotonic() + timeout
        while True:  # TimeoutExpired: the caller kills the process group
            now = time.monotonic()
            if idle is not None and now - lines.last >= idle:
                raise _Idle(proc.args, idle)
            try:
                proc.wait(timeout=max(0.0, min(1.0, deadline - now)))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
        for th in threads:
            th.join(timeout=5)
        return b"".join(out), b"".join(err)

    def hold(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Held:
        argv = validate_argv(argv)
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env
            )
        except FileNotFoundError:
            raise TransportError(f"{self.name}: {argv[0]} not found", f"install {argv[0]} there") from None
        return _LocalHeld(proc)

    def read_bytes(self, path: str) -> bytes:
        # A FIFO or a device planted where a file is expected is refused, never waited on
        # (FileOps.read_bytes: gpubox.readlimit), on every filesystem the ops stand for.
        return self.ops.read_bytes(path)

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: int | None = None, tmp_name: str | None = None
    ) -> None:
        """Through gpubox.safepath, anchored at the host's root prefix: no link followed beneath
        it, a new temp renamed over the target in the same directory fd, the old file's mode kept
        (read without following a link) when MODE is None. A caller-given temp name (Proxmox's
        `<file>.tmp.<pid>`) left by a killed run is removed first (unlinkat, ours only)."""
        if self.ops.claims(path):  # a filesystem with rules of its own (fsops): its calls, by path
            return self._write_via_ops(path, data, mode, tmp_name)
        with self._anchored(path, create=True) as (anchor, rel):
            safepath.write(anchor, rel, data, mode, tmp=tmp_name, keep_mode=mode is None)

    def read_bounded(self, path: str, limit: int) -> bytes:
        """A regular file of at most LIMIT bytes, no link followed beneath the root prefix; a FIFO
        or device is refused without blocking."""
        with self._anchored(path) as (anchor, rel):
            return safepath.read(anchor, rel, limit)

    @contextmanager
    def _anchored(self, path: str, create: bool = False):
        """(Anchor, relative path): the root prefix when PATH lies beneath it, else its parent.
        CREATE makes a missing root prefix (configuration, like the inventory that names it)."""
        a, rel = safepath.system_anchor(path, self.root) or safepath.anchor_of(path, [self.root])
        create = create and a == safepath.canonical(self.root)
        with safepath.Anchor(a, create=create) as anchor:
            yield anchor, rel

    def _write_via_ops(self, path: str, data: bytes, mode: int | None, tmp_name: str | None) -> None:
        """write_bytes_atomic through `self.ops` (a simulated box's pmxcfs): a new temp, written
        whole, fsync'ed and renamed over the target; no chmod."""
        d = os.path.dirname(path) or "."
        tmp = os.path.join(d, tmp_name or safepath.tmp_name(path))
        ops = self.ops
        if mode is None:
            try:
                mode = ops.lstat(path).st_mode & 0o7777
            except FileNotFoundError:
                mode = 0o644
        # A new file, never opened through what stands at that name (a planted symlink): O_EXCL.
        # A caller-given name (Proxmox's `<file>.tmp.<pid>`) left by a killed run is removed first.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = ops.open(tmp, flags, mode)
        except FileExistsError:
            if not tmp_name:
                raise
            ops.unlink(tmp)
            fd = ops.open(tmp, flags, mode)
        try:
            try:
                write_all(ops, fd, data)
                ops.fsync(fd)
            finally:
                ops.close(fd)
            ops.replace(tmp, path)
        except BaseException as exc:
            try:
                ops.unlink(tmp)
            except OSError:  # gone, or the filesystem refuses (a read-only /etc/pve): the cause is exc
                pass
            if isinstance(exc, OSError) and exc.filename is None:  # write(2)/fsync(2) name no file
                raise OSError(exc.errno, exc.strerror or str(exc), path) from None
            raise
        try:  # the rename itself is durable only once the directory is synced
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    def stat(self, path: str) -> FileStat | None:
        try:
            st = self.ops.lstat(path)
        except FileNotFoundError:
            return None
        # Device numbers only mean something for device nodes (and 0:0 is a valid one).
        is_dev = _stat.S_ISCHR(st.st_mode) or _stat.S_ISBLK(st.st_mode)
        rdev = (os.major(st.st_rdev), os.minor(st.st_rdev)) if is_dev else None
        return FileStat(path, st.st_mode, st.st_size, st.st_mtime, st.st_uid, st.st_gid, rdev)

    def listdir(self, path: str) -> list[str]:
        return sorted(self.ops.listdir(path))

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """mkdirat one component at a time beneath the root prefix, no link followed."""
        if self.ops.claims(path):
            self.ops.makedirs(path, mode)
            return
        if safepath.canonical(path) == safepath.canonical(self.root):
            os.makedirs(path, mode=mode, exist_ok=True)
            return
        with self._anchored(path, create=True) as (anchor, rel):
            os.close(anchor.makedirs(rel, mode))

    def remove(self, path: str) -> None:
        """unlinkat relative to the parent's fd, only a file (or link: never its target) of ours."""
        if self.ops.claims(path):
            self.ops.unlink(path)
            return
        with self._anchored(path) as (anchor, rel):
            if not safepath.remove(anchor, rel):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)


def write_all(ops: FileOps, fd: int, data: bytes) -> None:
    """Write every byte: a short write (a filesystem at its size limit) is followed by another,
    whose error (EFBIG) then names the problem."""
    view = memoryview(data)
    while view:
        n = ops.write(fd, view)
        view = view[n:]


class _LocalHeld(Held):
    def __init__(self, proc: subprocess.Popen):
        super().__init__()
        self.proc = proc
        self._err = b""
        threading.Thread(target=self._drain, daemon=True).start()
        self._start()

    def _drain(self) -> None:
        self._err = self.proc.stderr.read()

    def _read(self) -> bytes:
        return self.proc.stdout.read1(4096)

    def _close_stdin(self) -> None:
        self.proc.stdin.close()

    def _poll(self) -> int | None:
        return self.proc.poll()

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stderr_text(self) -> str:
        return self._err.decode(errors="replace")


def kill_tree(pid: int) -> None:
    """SIGKILL PID's process group and all its descendants (found before anything dies)."""
    try:
        import psutil

        kids = psutil.Process(pid).children(recursive=True)
    except Exception:  # psutil missing or PID gone: the group kill below still applies
        kids = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for k in kids:
        try:
            k.kill()
        except Exception:
            pass
