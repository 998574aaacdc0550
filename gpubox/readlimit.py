"""Bounded reads of files someone else could write: regular files only, never more than a limit.

A path handed to gpubox (an inventory, a result or probe document, a history store, a file in the
container) can be a FIFO, which blocks open(2) and read(2) forever, or a device such as /dev/zero,
which never ends and fills memory. So every such read goes through `read_regular`: the file is
opened with O_NONBLOCK (open(2): a FIFO opened O_RDONLY|O_NONBLOCK returns at once instead of
waiting for a writer), checked with fstat(2) to be a regular file, and read to at most LIMIT + 1
bytes, so a file that grows past the limit while it is read is refused as well. /proc and /sys
files are regular files of size 0 whose content is generated on read: the byte bound covers them.
"""

from __future__ import annotations

import os
import stat

from .errors import GpuboxError, not_utf8, os_error

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


class NotRegular(GpuboxError):
    """A path that is not a regular file, or is larger than the reader accepts."""


def kind_of(mode: int) -> str:
    """A file type in words, for the one-line refusal."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_regular(path, limit: int, *, what: str = "file") -> bytes:
    """The bytes of PATH, a regular file of at most LIMIT bytes; else NotRegular naming it.

    OSError from open(2) (ENOENT, EACCES...) is passed on unchanged, so callers keep their own
    "no such file" wording; FileNotFoundError in particular stays catchable."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        return read_fd(fd, limit, path, what=what)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int, path, *, what: str = "file") -> bytes:
    """The bytes of an open FD (opened O_NONBLOCK by the caller), if it is a regular file of at
    most LIMIT bytes; else NotRegular naming PATH. The caller closes FD."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(
            f"{what} {os.fsdecode(path)} is {kind_of(st.st_mode)}, not a regular file",
            "give a regular file",
        )
    if st.st_size > limit:
        raise too_large(path, limit, what, st.st_size)
    chunks, got = [], 0
    while got <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        raise too_large(path, limit, what, None)
    return b"".join(chunks)


def too_large(path, limit: int, what: str, size: int | None) -> NotRegular:
    """The refusal for a file over its bound (SIZE when fstat knew it)."""
    have = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return NotRegular(
        f"{what} {os.fsdecode(path)} is {have}, over the {_human(limit)} gpubox reads",
        "give the right file; this one is too large to be one",
    )


def read_regular_or_error(path, limit: int, *, what: str = "file") -> bytes:
    """read_regular, with an OSError turned into the one-line GpuboxError (errno, path, fix)."""
    try:
        return read_regular(path, limit, what=what)
    except OSError as exc:
        raise os_error(exc) from None


def _human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


HOST_FILE_LIMIT = 64 << 20  # a config, a /proc or /sys file, a record: far below this


def read_text_file(path, *, what: str = "file") -> str:
    """A local text file, or a one-line GpuboxError (missing, unreadable, not a regular file,
    over 64 MiB, not UTF-8)."""
    data = read_regular_or_error(path, 64 << 20, what=what)  # a FIFO or a device: one line
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise not_utf8(f"{what} {path}", data, exc) from None
