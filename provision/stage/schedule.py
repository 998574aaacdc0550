"""The work-stealing schedule: one file being copied (FileJob), a worker's span of its ranges
(Span), and the schedule that hands ranges to workers (Schedule).

tmpfs takes the inode lock for every write to a file, so writers of one file queue: Schedule
spreads workers over files first, then splits the large shards across workers by stealing the
back half of the longest stretch left (each pwrite()s into the one NAME.partial at its offsets),
so the last big shard is not left to one stream. Each worker reads its stretch of a file through
one open file of its own (POSIX_FADV_SEQUENTIAL), so the kernel's readahead follows each stream
from range to range, and writers of one file take turns on a lock of ours (asleep, not spinning
on the inode lock: 16 cores, 16 GB warm, 0.69 against 0.86 CPU-s/GB).
"""

from __future__ import annotations

import os
import threading

from . import sizes
from .manifest import temp_path
from .readers import NO_LOCK, map_destination

# writers of one file take turns on a lock of ours around each pwrite (GPUBOX_STAGE_WRITE_LOCK=0:
# not, for the benchmark): tmpfs holds the inode lock for the whole copy of a write, and a second
# writer spins on it while the holder runs (rwsem optimistic spinning), burning a core for nothing;
# on our lock it sleeps, and its read and checksum still overlap the holder's write
WRITE_LOCK = os.environ.get("GPUBOX_STAGE_WRITE_LOCK", "1").strip() != "0"


class FileJob:
    """One file being copied: the destination fd and a witness source fd opened by the first chunk,
    finished by the last (Schedule hands out its ranges).
    `resume`: range -> digest journaled by an interrupted run whose NAME.partial is still there;
    those ranges are re-hashed in the partial and copied again only where they differ."""

    def __init__(self, src: str, dest: str, rel: str, info: dict, resume: dict[int, bytes] | None = None):
        self.rel, self.info = rel, info
        self.spath, self.dpath = os.path.join(src, rel), os.path.join(dest, rel)
        self.partial = temp_path(self.dpath)
        self.n = sizes.nchunks(info["size"])
        self.whole = bool(info.get("hub_sha256"))  # one sequential pass (the hub's whole-file sha256)
        self.resume = {} if self.whole else dict(resume or {})
        self.digests: list = [None] * self.n
        # range -> (hash, bytes): the cold probe copied the range's first bytes (probe.ColdProbe._probe)
        self.heads: dict[int, tuple] = {}
        self.left = self.n
        self.lock = threading.Lock()
        # held around each pwrite into the partial (WRITE_LOCK): writers of one file wait here
        # asleep instead of spinning on the tmpfs inode lock (see Schedule)
        self.wlock = threading.Lock() if WRITE_LOCK else NO_LOCK
        self.sfd = self.dfd = None
        self.ident: tuple[int, int] | None = None
        self.finished = False
        # written through a shared mapping (readers.map_span), not pwrite: set by the Copier for a
        # big file on tmpfs, where writers of one file would queue on the inode lock
        self.mapped = False
        self.map = self.view = None  # the mapping (readers.map_destination), while open

    def open(self) -> None:
        with self.lock:
            if self.sfd is None:
                self.sfd = os.open(self.spath, os.O_RDONLY)
                st = os.fstat(self.sfd)
                self.ident = (st.st_dev, st.st_ino)
                # 0600 until complete; _finish gives it the source's mode (never wider on the way).
                # A partial with journaled ranges is kept (resume); any other starts empty.
                # O_NOFOLLOW: a link planted at NAME.partial (next to a forged journal) is refused,
                # never truncated or written through
                flags = (
                    (os.O_RDWR if self.mapped else os.O_WRONLY)
                    | os.O_CREAT
                    | os.O_NOFOLLOW
                    | (0 if self.resume else os.O_TRUNC)
                )
                self.dfd = os.open(self.partial, flags, 0o600)
                if self.mapped and self.info["size"]:
                    self.map, self.view = map_destination(self.dfd, self.info["size"])

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            try:
                self.map.close()
            except BufferError:  # a slice still held by a traceback: unmapped when it is collected
                pass
            self.map = self.view = None
        for fd in (self.sfd, self.dfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.sfd = self.dfd = None


class Span:
    """One worker's share of a file: ranges [next, stop), copied in order, so the worker's reads of
    it are one sequential stream on one fd (readers.Streams) and the kernel's readahead window carries
    over from range to range."""

    __slots__ = ("job", "next", "stop")

    def __init__(self, job: FileJob, nxt: int, stop: int):
        self.job, self.next, self.stop = job, nxt, stop


class Schedule:
    """Hands 64 MiB ranges to workers: a worker goes on along its own span; when that is done it
    takes the first file nobody has started, and once every file is started it takes the back half
    of the span with the most ranges left (work stealing), so a large shard is split across workers
    (each pwrite()ing its ranges into the one NAME.partial at their offsets), each reading a
    contiguous stretch of it.

    Why files first: tmpfs serialises writes to one file (shmem_file_write_iter holds the inode lock
    for the copy), so writers of one file queue behind each other and spin on the lock; spreading
    them over files first costs nothing and keeps that rare. Why spans rather than ranges in turn:
    two workers alternating the ranges of one file each read 64 MiB, then jump, and the readahead
    of a cold source starts over at every range (one buffered stream per file read 2.16 GB/s on the
    16-core device VM where the engine's alternating ranges reached 1.60; benchmarks/results/stage.md, run I).
    Files finish roughly in order (largest first), and the journal records each finished range, so
    an interrupted run resumes."""

    def __init__(self, jobs: list[FileJob]):
        self.fresh = [j for j in jobs if j.whole] + [j for j in jobs if not j.whole]
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        self.stop = False

    def take(self, span: Span | None) -> tuple[Span, int | None] | None:
        """The next (span, range) for the worker that holds `span` (range None: the whole file in
        one pass), or None when nothing is left."""
        with self.lock:
            if self.stop:
                return None
            if span is not None and span.next < span.stop:
                span.next += 1
                return span, span.next - 1
            if self.fresh:
                job = self.fresh.pop(0)
                if job.whole:  # the hub's sha256 runs along the file: never split
                    return Span(job, job.n, job.n), None
                span = Span(job, 1, job.n)
                self.spans.append(span)
                return span, 0
            self.spans = [s for s in self.spans if s.next < s.stop]
            if not self.spans:
                return None
            victim = max(self.spans, key=lambda s: s.stop - s.next)
            mid = victim.stop - max(1, (victim.stop - victim.next) // 2)
            span = Span(victim.job, mid + 1, victim.stop)
            victim.stop = mid
            self.spans.append(span)
            return span, mid
