"""The file operations a local transport and the container-config commit make, as one object.

`FileOps` is the plain kernel: every method is the os call of the same name. A local transport
holds one (`LocalTransport.ops`), and so does everything that writes through it, so a filesystem
with rules of its own can stand behind the same calls: a simulated box gives its host an object
with Proxmox's cluster filesystem rules for `/etc/pve` (chmod refused, no RENAME_EXCHANGE, 1 MiB
per file, read-only without quorum), and the code under test takes the path a real host makes it
take. Methods raise OSError with the errno the filesystem gives, like the os calls they wrap.
"""

from __future__ import annotations

import ctypes
import errno
import os

_RENAME_NOREPLACE = 1  # linux include/uapi/linux/fcntl.h
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class FileOps:
    """The kernel's file calls, unchanged (see the module docstring)."""

    def claims(self, path: str) -> bool:
        """Whether PATH lies on a filesystem with rules of its own, so a transport makes its calls
        for PATH through this object by path (else its own safe-path layer: gpubox.safepath)."""
        return False

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def read_bytes(self, path: str) -> bytes:
        """A regular file, bounded: a FIFO or a device planted where a file is expected is
        refused without blocking (gpubox.readlimit)."""
        from .. import readlimit

        return readlimit.read_regular(path, readlimit.HOST_FILE_LIMIT)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.mkdir(path, mode)

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        if os.path.isdir(path):
            return
        parent = os.path.dirname(path.rstrip("/"))
        if parent and parent != path and not os.path.isdir(parent):
            self.makedirs(parent, mode)
        try:
            self.mkdir(path, mode)
        except FileExistsError:
            if not os.path.isdir(path):
                raise

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def rename2(self, src: str, dst: str, flags: int) -> None:
        """renameat2(2) with FLAGS (RENAME_EXCHANGE / RENAME_NOREPLACE); OSError(ENOSYS) where
        the C library has no renameat2."""
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
        except (OSError, AttributeError):
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), dst) from None
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), dst)

    def exchange(self, a: str, b: str) -> bool:
        """Swap two paths atomically; False where the filesystem or kernel cannot (EINVAL on a FUSE
        filesystem without it, such as pmxcfs)."""
        try:
            self.rename2(a, b, _RENAME_EXCHANGE)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
                return False
            raise
        return True

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(path, uid, gid)

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst)

    def symlink(self, target: str, path: str) -> None:
        os.symlink(target, path)

    def mkfifo(self, path: str, mode: int = 0o600) -> None:
        os.mkfifo(path, mode)

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        os.setxattr(path, name, value)

    def utime(self, path: str, times: tuple[float, float]) -> None:
        os.utime(path, times)


RENAME_NOREPLACE, RENAME_EXCHANGE = _RENAME_NOREPLACE, _RENAME_EXCHANGE
POSIX = FileOps()
