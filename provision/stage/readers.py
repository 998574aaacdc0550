"""Reading the source: buffered and O_DIRECT readers, the page-cache residency they choose by,
and the span copy every path goes through (read, write, hash each slice while it is in cache).

Why plain reads (preadv into a per-thread buffer), measured on 32 cores (16 GB, warm): the
earlier mmap of each source chunk cost 77 CPU-s (78k minor faults, 4.8 CPU-s/GB, 10x cp) for
2.8 GB/s; plain reads 19 CPU-s (1.2 CPU-s/GB, 2.4x cp) for 11.6 GB/s, as fast as `xargs -P32 cp`.
256 KiB slices measured the same on 2 cores but 296k context switches (GIL hand-offs between 16
threads) and 1.4x the wall on 32 cores; 4 MiB fall out of L2. Plain reads also cannot SIGBUS: a
source truncated under the copy gives a short read, which is the "source shrank" error (a read of
a mapping past a new EOF kills the process with SIGBUS).

sendfile/copy_file_range cannot hash without a second read (copy_file_range also fails across
filesystems: EXDEV); sendfile + hashing the destination measured slower (1.27 vs 0.68 CPU-s/GB
on 2 cores), and so did preadv straight into an mmap of the destination (page faults: 1.17).
sendfile in 8 MiB calls + hashing from a MAP_POPULATE mapping of the destination (no faults per
page) was slower on 16 cores too: 8 GB warm 1.29 s against 0.83 s, the same CPU.

Reading a cold source: after a reboot the source is not in the page cache. Two ways to read it,
and which is faster depends on the box (measured, benchmarks/results/stage.md: on a 16-core VM
`xargs -P16 cp`'s buffered reads reached 1.66 GB/s and one O_DIRECT stream per file 1.47; on a
32-core one 2.28 and 2.23; on the 2-core VM O_DIRECT took half the CPU of buffered reads), so a
short probe decides (probe.ColdProbe):
- O_DIRECT: the device writes into our buffer, no page-cache insertion (allocation, LRU, later
  reclaim; the pages would also be charged to the container's memory cgroup next to the tmpfs
  copy). DIRECT_BLOCK per read, probe.COLD_THREADS threads: enough requests in flight.
- buffered: the kernel's readahead along each worker's span (one fd per span, so its window
  carries over from range to range; POSIX_FADV_SEQUENTIAL doubles it), PREFETCH more if set.
Chunks whose pages ARE cached are read buffered (O_DIRECT would go to the device for data already
in memory). Residency comes from cachestat(2) (Linux 6.5+; it reads the page cache's counters,
starts no I/O and maps nothing); where it is missing, or the filesystem is not a local block
filesystem, reads stay buffered.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
import threading

from . import sizes
from .errors import StageError

DIRECT_FS = {"ext4", "xfs", "btrfs", "f2fs", "ext3", "ext2"}
# cold source read buffered: POSIX_FADV_WILLNEED this far ahead of each stream, on top of the kernel's
# readahead. Off (0) by default: measured slower wherever it was tried (16 GB cold on the 16-core
# device VM: 1.55 GB/s with 16 MiB against 1.71 without, 3 rounds of 3; 4 GB on a 2-core VM: 1.27
# against 1.41 GB/s, less CPU without; benchmarks/results/stage.md run K)
PREFETCH = int(os.environ.get("GPUBOX_STAGE_PREFETCH_KIB") or 0) << 10
NO_LOCK = contextlib.nullcontext()  # a write lock that is none (reusable)
_NR_CACHESTAT = 451  # the same number on x86_64 and the asm-generic table (arm64)
_cachestat_fn: list = []
_tls = threading.local()


def _buf() -> memoryview:
    """This thread's read buffer: anonymous memory, page-aligned as O_DIRECT reads require (an
    anonymous mapping maps no file, so nothing about it can SIGBUS). DIRECT_BLOCK bytes: a cold
    read fills all of it, a buffered one BUF."""
    b = getattr(_tls, "buf", None)
    if b is None:
        b = _tls.buf = memoryview(mmap.mmap(-1, sizes.DIRECT_BLOCK))
    return b


def _cachestat():
    """libc's syscall() set up for cachestat, or None (no ctypes/libc)."""
    if not _cachestat_fn:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.syscall
            fn.restype = ctypes.c_long
            _cachestat_fn.append((ctypes, fn))
        except (ImportError, OSError, AttributeError):
            _cachestat_fn.append(None)
    return _cachestat_fn[0]


def cached_bytes(fd: int, start: int, length: int) -> int | None:
    """Bytes of [start, start+length) of fd in the page cache, or None where cachestat is missing."""
    cs = _cachestat()
    if cs is None or not sys.platform.startswith("linux"):
        return None
    ctypes, fn = cs
    rng = (ctypes.c_uint64 * 2)(start, length)
    out = (ctypes.c_uint64 * 5)()
    if (
        fn(
            ctypes.c_long(_NR_CACHESTAT),
            ctypes.c_long(fd),
            ctypes.byref(rng),
            ctypes.byref(out),
            ctypes.c_long(0),
        )
        != 0
    ):
        return None
    return out[0] * mmap.PAGESIZE


def direct_fd(path: str, ident: tuple[int, int]) -> int | None:
    """path opened with O_DIRECT (the same inode as ident), or None where O_DIRECT is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != ident:
        os.close(fd)
        raise StageError(
            f"source file {path} was replaced during the copy", "re-run when the source is stable"
        )
    return fd


def open_src(path: str, ident: tuple[int, int] | None = None) -> int:
    """The source opened for one reader: its own open file, so the kernel's readahead follows this
    reader's sequential stream (readers sharing one fd share one readahead state and defeat it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if ident is not None and (st.st_dev, st.st_ino) != ident:
            raise StageError(
                f"source file {path} was replaced during the copy", "re-run when the source is stable"
            )
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger readahead window
    except BaseException:
        os.close(fd)
        raise
    return fd


def _shrank(off: int) -> StageError:
    return StageError(f"source shrank while reading (at byte {off})", "re-run when the source is stable")


class NoRoom(Exception):
    """The destination's filesystem (or quota) is full: Copier turns it into a StageError naming DEST."""


def _write(dfd: int, view, off: int) -> None:
    w = 0
    try:
        while w < len(view):
            w += os.pwrite(dfd, view[w:] if w else view, off + w)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoRoom(exc.strerror) from None
        raise


def _prefetch(fd: int, off: int, n: int) -> None:
    if n > 0 and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)


def copy_span(
    h,
    sfd: int,
    dfd: int | None,
    start: int,
    end: int,
    extra=None,
    advance=None,
    block: int = sizes.BUF,
    prefetch: int = 0,
    wlock=NO_LOCK,
) -> None:
    """Read [start, end) of sfd once, `block` bytes a read: write each BUF slice to dfd at the same
    offset and feed it to the hash `h` (and `extra`) while it is in the CPU cache. Plain reads cannot
    SIGBUS when the source shrinks (a read of a mapping past a new EOF does): a short read is an error.
    `prefetch`: keep that much ahead of the reads asked of the kernel (POSIX_FADV_WILLNEED).
    `wlock`: the destination file's write lock (schedule.FileJob.wlock), held around each pwrite."""
    buf, off, pending = _buf(), start, 0
    if prefetch:
        _prefetch(sfd, start, min(prefetch, end - start))
    while off < end:
        want = min(block, end - off)
        # whole pages: an O_DIRECT read of a length that is not block-aligned is EINVAL (only the
        # last read of a file is short; chunk ends are CHUNK-aligned)
        ask = -(-want // mmap.PAGESIZE) * mmap.PAGESIZE
        if prefetch:
            _prefetch(sfd, off + prefetch, min(block, end - off - prefetch))
        n = min(os.preadv(sfd, [buf[:ask]], off), want)
        if n == 0:
            raise _shrank(off)
        for p in range(0, n, sizes.BUF):
            view = buf[p : min(n, p + sizes.BUF)]
            if dfd is not None:
                with wlock:
                    _write(dfd, view, off + p)
            h.update(view)
            if extra is not None:
                extra.update(view)
        off += n
        pending += n
        if advance and pending >= 32 * sizes.BUF:
            advance(pending)
            pending = 0
    if advance and pending:
        advance(pending)


# Big files on tmpfs can be written through one shared mapping of the destination (map_destination,
# map_span) instead of pwrite, so that the writers of one file do not queue on the tmpfs inode lock.
# Each 4 KiB page then faults in on first touch (1.47M minor faults for 6 GB), which costs CPU: it
# pays where pwrite leaves workers idle (one big file: 3.2 GB/s against pwrite's 2.2 and cp -r's 1.8
# on the 16-core device VM), not where the files alone keep every worker busy (8 shards: 6.7 against
# 9.1), and always on a tmpfs mounted with huge pages (one fault per 2 MiB; one big file: 14.4
# against 4.0). docs/stage.md "Writing one big file".
# GPUBOX_STAGE_MAP_MIB: "auto" (default: files of 256 MiB or more, where map_pays), N (every file of
# at least N MiB on tmpfs), "off" (never).
_MAP_SETTING = (os.environ.get("GPUBOX_STAGE_MAP_MIB") or "auto").strip().lower()
MAP_AUTO = _MAP_SETTING == "auto"
MAP_MIN = 256 << 20 if MAP_AUTO else (int(_MAP_SETTING) << 20 if _MAP_SETTING.isdigit() else None)
MAP_FS = {"tmpfs"}  # the filesystems whose write(2) serializes writers of one file and that map cheaply
HUGE = ("huge=always", "huge=within_size")  # tmpfs mount options that give big files 2 MiB pages


# GPUBOX_STAGE_MAP_PWRITERS=K (default 1): the first K copy threads write their ranges of a mapped
# file with pwrite, taking turns on the file's write lock, while the others write through the
# mapping. Its pages are allocated by then (map_destination), so a pwrite is a copy under the inode
# lock and no page fault: one such writer adds to what the faulting ones move (16-core device VM,
# 12 GB into one file from a buffer: 21.2-24.9 GB/s through the mapping alone, 23.2-27.5 with one
# pwrite writer, two 22.2-25.4; the copier, one 12 GB file warm: 4.72 GB/s against 4.17 without,
# benchmarks/results/stage.md run P).
MAP_PWRITERS = max(0, int(os.environ.get("GPUBOX_STAGE_MAP_PWRITERS") or 1))


def map_pays(big_files: int, workers: int, mount_options: tuple[str, ...]) -> bool:
    """Whether the big files of this copy are written through mappings (MAP_AUTO): on a tmpfs with
    huge pages, always; else when they are too few to keep the workers busy with pwrite (at most a
    quarter as many as workers: one big file, a big shard beside small files)."""
    if any(o in HUGE for o in mount_options):
        return True
    return 0 < big_files <= max(1, workers // 4)


def map_destination(dfd: int, size: int):
    """(mapping, memoryview) of the whole destination file, MAP_SHARED, its `size` bytes allocated
    first (posix_fallocate: a full tmpfs is ENOSPC here, never a SIGBUS on a page fault later). One
    mapping per file, made once: a mapping per range (mmap/munmap under the process's mmap lock,
    with a TLB shootdown each) measured as slow as pwrite (docs/stage.md)."""
    try:
        os.posix_fallocate(dfd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM):
            raise NoRoom(exc.strerror) from None
        raise
    m = mmap.mmap(dfd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return m, memoryview(m)


def map_span(
    h, sfd: int, view, start: int, end: int, extra=None, advance=None, block: int = sizes.BUF
) -> None:
    """copy_span's contract, the destination being `view`, a shared mapping of the whole file
    (map_destination): the source is read straight into the mapping (preadv; the pages fault in on
    first touch, no inode lock) and each BUF slice hashed from the mapping, i.e. the bytes written,
    while it is in the CPU cache. No write(2): the workers of one big file fill their ranges in
    parallel. Only for a source in the page cache (probe.ColdProbe._map_big_files): buffered reads,
    so no page rounding and no readahead hints."""
    off, pending = start, 0
    while off < end:
        want = min(block, end - off)
        n = min(os.preadv(sfd, [view[off : off + want]], off), want)
        if n == 0:
            raise _shrank(off)
        for p in range(off, off + n, sizes.BUF):
            part = view[p : min(off + n, p + sizes.BUF)]
            h.update(part)
            if extra is not None:
                extra.update(part)
            part.release()
        off += n
        pending += n
        if advance and pending >= 32 * sizes.BUF:
            advance(pending)
            pending = 0
    if advance and pending:
        advance(pending)


class Streams:
    """A worker's open source fds for the file it copies, one per read path ("direct", "buffered"):
    kept from range to range of that file (the readahead state lives in the open file), closed
    when the worker moves to another file or stops."""

    def __init__(self):
        self.job = None  # the schedule.FileJob these fds read
        self.pwriter = False  # this worker pwrite()s a mapped file's ranges (MAP_PWRITERS)
        self.fds: dict[str, int] = {}

    def get(self, job, kind: str, opener) -> int | None:
        if job is not self.job:
            self.close()
            self.job = job
        if kind not in self.fds:
            fd = opener()
            if fd is None:
                return None
            self.fds[kind] = fd
        return self.fds[kind]

    def drop(self, kind: str) -> None:
        fd = self.fds.pop(kind, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for kind in list(self.fds):
            self.drop(kind)
        self.job = None
