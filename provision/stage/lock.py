"""One stager at a time: an flock beside the destination; a second stager is refused, not queued."""

from __future__ import annotations

import errno
import fcntl
import os

from .errors import StageError

LOCK = ".gpubox-stage.lock"  # as .NAME.gpubox-stage.lock beside the destination


class Lock:
    """flock on .NAME.gpubox-stage.lock beside DEST (so a refused run need not create DEST);
    a second stager is refused, not queued."""

    def __init__(self, dest: str):
        dest = os.path.abspath(dest)
        self.dest = dest
        self.path = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}{LOCK}")
        self.fd = None

    def __enter__(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StageError(
                f"another stager (pid {holder}) is staging into {self.dest}",
                "wait for it to finish, then re-run",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing drops the flock; the file stays (unlinking would race a waiter)
