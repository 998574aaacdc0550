"""One stager at a time: an flock in a private directory beside the destination; a second stager is
refused, not queued.

The destination's parent is usually /dev/shm, mode 1777: anyone may plant a name there, so the lock
file does not live there. It lives in `.gpubox-stage/` beside the destination, a directory gpubox
makes itself (mode 0700, its own euid, checked on every open: gpubox.safepath.private_dir), opened
O_NOFOLLOW relative to that directory's fd; the holder's pid is written through the fd. When the
run ends the lock file is unlinked while still held, and a waiter that got the lock on an unlinked
file sees that (its fd's inode is no longer the name's) and takes the new one, so no lock file
stays behind in /dev/shm and two stagers never both hold it.
"""

from __future__ import annotations

import errno
import fcntl
import os

from gpubox import safepath

from .errors import StageError

LOCK = ".gpubox-stage.lock"  # older releases': .NAME.gpubox-stage.lock beside the destination
LOCK_DIR = ".gpubox-stage"  # gpubox's private directory beside the destination (0700)


class Lock:
    """flock on .gpubox-stage/NAME.lock beside DEST (so a refused run need not create DEST)."""

    def __init__(self, dest: str):
        dest = safepath.canonical(os.path.abspath(dest))
        self.dest = dest
        self.parent = os.path.dirname(dest)
        self.name = f"{os.path.basename(dest)}.lock"
        self.path = os.path.join(self.parent, LOCK_DIR, self.name)
        self.fd = self.dfd = None

    def _private_dir(self) -> int:
        try:
            with safepath.Anchor(self.parent) as anchor:
                return safepath.private_dir(anchor, LOCK_DIR)
        except safepath.Refused as exc:
            raise StageError(exc.problem, exc.fix) from None

    def __enter__(self):
        for _ in range(20):
            if self.dfd is None:
                self.dfd = self._private_dir()
            try:
                fd = os.open(
                    self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.dfd
                )
            except FileNotFoundError:  # a finishing stager removed the empty directory just now
                os.close(self.dfd)
                self.dfd = None
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()[:20] or "?"
                os.close(fd)
                os.close(self.dfd)
                raise StageError(
                    f"another stager (pid {holder}) is staging into {self.dest}",
                    "wait for it to finish, then re-run",
                ) from None
            st = safepath.entry(self.dfd, self.name)
            if st is not None and (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                break
            os.close(fd)  # the holder unlinked it as it finished: take the new one
        else:
            if self.dfd is not None:
                os.close(self.dfd)
            raise StageError(f"cannot take the stage lock {self.path}", "re-run")
        os.ftruncate(fd, 0)  # our own file, through our fd
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        try:
            os.unlink(self.name, dir_fd=self.dfd)  # still held: a waiter re-checks the inode
        except OSError:
            pass
        os.close(self.fd)
        os.close(self.dfd)
        try:
            pfd = os.open(self.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.rmdir(LOCK_DIR, dir_fd=pfd)
            finally:
                os.close(pfd)
        except OSError:
            pass  # another stager's lock is in it, or it is gone already
