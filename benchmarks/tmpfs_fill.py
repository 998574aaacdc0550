#!/usr/bin/env python3
"""How fast this machine can put new bytes into a tmpfs at all (issue 41): the ceiling any copier
into it works under, measured without a source to read and without a checksum.

Each case writes --size GB of new pages with N threads (64 MiB ranges handed out in turn) from a
1 MiB buffer that stays in the CPU cache, so what is timed is the destination's side alone:

  memory, touched            memcpy into anonymous memory already faulted in: the write bandwidth
  memory, fresh pages        memcpy into a fresh anonymous mapping: a page fault, zeroing and the
                             copy per 4 KiB page (the VM's cost of handing out new memory)
  tmpfs pwrite, a file each  pwrite into a file per thread: page allocation and the copy, no
                             zeroing, no lock shared between threads (the best case of a sharded model)
  tmpfs pwrite, one file     pwrite by all threads into one file: the inode lock
  tmpfs fallocate, one call  posix_fallocate of the whole file (the allocation alone, under the lock)
  tmpfs pwrite, K files      (--files K) pwrite into K files, a layout of K shards: at most K
                             writers at a time; and "K files, pwrite + faults": K threads pwrite,
                             the others fault pages of the same files in (both ways at once)
  tmpfs mapped, ...          one file through one shared mapping, its pages allocated whole first
                             (fallocate), a range at a time by the thread writing it, by a thread
                             of their own ahead of the writers, or by the faults themselves (no
                             fallocate: no clean ENOSPC, only to compare); "copy only": into pages
                             allocated before the clock, by the mapping alone or with 1-2 threads
                             pwrite()ing instead (no fault)

The memcpy is ctypes.memmove (it releases the GIL, as the copier's preadv does). Why a script of
its own: no tool we know of times tmpfs's write paths against each other (fio's mmap engine maps
per job file; dd writes one stream).

    python3 benchmarks/tmpfs_fill.py --size 6 --threads 16 [--tmpfs /dev/shm] [--json-out F]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import tempfile
import threading
import time

RANGE = 64 << 20
BLK = 1 << 20


# The cases that write into one file and allocate its pages as they go, however: what bounds a
# copy into one file ("copy only" fills pages allocated before the clock, and "fallocate, one
# call" writes nothing). And the copy cases for one file (Fill.copy_cases).
ONE_FILE = (
    "tmpfs pwrite, one file",
    "tmpfs mapped, fallocate whole",
    "tmpfs mapped, fallocate per range",
    "tmpfs mapped, faults allocate",
    "tmpfs mapped, an allocator ahead",
)
COPY_ONE_FILE = (
    "copy: one file, fallocate + mapping + 1 pwrite",
    "copy: one file, fallocate + mapping",
    "copy: one file, pwrite",
)
COPY_EACH = "copy: a file each, pread + pwrite"


def k_files(k: int) -> tuple[str, str, str]:
    """The names of the cases for a layout of k shards: pwrite, pwrite with faulting writers
    beside, and the copy (Fill(files=k))."""
    return f"tmpfs pwrite, {k} files", f"tmpfs {k} files, pwrite + faults", f"copy: {k} files, pread + pwrite"


def run_ranges(n: int, ranges: list, fn) -> float:
    """Seconds for n threads to run fn(start, end, thread) over `ranges`, handed out in turn
    (`thread`: 0..n-1, which of them runs it)."""
    it = iter(ranges)
    lock = threading.Lock()
    errors: list = []

    def run(t: int):
        try:
            while True:
                with lock:
                    r = next(it, None)
                if r is None:
                    return
                fn(*r, t)
        except BaseException as exc:  # shown after the join: a failed case must not look fast
            errors.append(exc)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def address(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


class Fill:
    """The cases, on one tmpfs directory; each returns seconds for `size` bytes."""

    def __init__(self, tmpfs: str, size: int, threads: int, files: int = 0, source: str | None = None):
        self.files = files
        # a file in the page cache to copy from ("copy:" cases): the copier's own work, less its
        # checksum and the Python around it
        self.sfd = os.open(source, os.O_RDONLY) if source else None
        self.ssize = os.fstat(self.sfd).st_size // BLK * BLK if source else 0
        self.dir = tempfile.mkdtemp(prefix="gpubox-fill-", dir=tmpfs)
        self.size, self.n = size, threads
        self.ranges = [(o, min(size, o + RANGE)) for o in range(0, size, RANGE)]
        self.buf = mmap.mmap(-1, BLK)
        self.buf.write(os.urandom(BLK))
        self.src = address(self.buf)
        self._tls = threading.local()
        self.copying = False

    def _fresh(self, name: str) -> tuple[int, str]:
        p = os.path.join(self.dir, name)
        return os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), p

    def _drop(self, fd: int, path: str) -> None:
        os.close(fd)
        os.unlink(path)

    def _src_off(self, off: int) -> int:
        return off % self.ssize if self.ssize else off

    def _put(self, fd: int, off: int, n: int = BLK, src: int | None = None) -> None:
        """n bytes at off into fd with pwrite: from the buffer, or (self.copying) read from the
        source (at `src`, default `off`) into this thread's buffer first, as a copier does."""
        if self.copying:
            buf = getattr(self._tls, "buf", None)
            if buf is None:
                buf = self._tls.buf = memoryview(bytearray(BLK))
            os.preadv(self.sfd, [buf[:n]], self._src_off(off if src is None else src))
            os.pwrite(fd, buf[:n], off)
        else:
            os.pwrite(fd, self.buf[:n] if n < BLK else self.buf, off)

    def _map_put(self, view: memoryview, base: int, s: int, e: int) -> None:
        """[s, e) of a mapping: memmove from the buffer, or (self.copying) preadv from the source
        straight into the mapping, as the copier's mapped writer does."""
        if not self.copying:
            self._copy_into(base, s, e)
            return
        for o in range(s, e, BLK):
            os.preadv(self.sfd, [view[o : min(e, o + BLK)]], self._src_off(o))

    def _copy_into(self, base: int, s: int, e: int) -> None:
        for o in range(s, e, BLK):
            ctypes.memmove(base + o, self.src, min(BLK, e - o))

    def memory(self, touched: bool) -> float:
        m = mmap.mmap(-1, self.size)
        base = address(m)
        if touched:
            run_ranges(self.n, self.ranges, lambda s, e, _: self._copy_into(base, s, e))
        t = run_ranges(self.n, self.ranges, lambda s, e, _: self._copy_into(base, s, e))
        m.close()
        return t

    def pwrite_each(self) -> float:
        files = [self._fresh(f"each-{k}") for k in range(self.n)]

        def w(s, e, t):
            for o in range(s, e, BLK):
                self._put(files[t][0], o, min(BLK, e - o))

        t = run_ranges(self.n, self.ranges, w)
        for fd, p in files:
            self._drop(fd, p)
        return t

    def pwrite_files(self, k: int) -> float:
        """All threads pwrite() into k files, range r into file r % k (a layout of k shards: at
        most k writers at a time, the inode lock)."""
        files = [self._fresh(f"k-{j}") for j in range(k)]

        def w(s, e, _):
            fd, base = files[(s // RANGE) % k][0], (s // RANGE) // k * RANGE
            for o in range(0, e - s, BLK):
                self._put(fd, base + o, src=s + o)

        t = run_ranges(self.n, self.ranges, w)
        for fd, p in files:
            self._drop(fd, p)
        return t

    def files_both(self, k: int) -> float:
        """k files as in pwrite_files, k threads pwrite()ing (a file each, the inode lock) while
        the others write other ranges of the same files through shared mappings whose faults
        allocate the pages (no lock; the fastest way in, and unsafe for a copier: a full tmpfs is
        a SIGBUS): both ways of allocating at once, the bound of a hybrid copier."""
        per = -(-len(self.ranges) // k) * RANGE
        files = [self._fresh(f"b-{j}") for j in range(k)]
        maps = []
        for fd, _ in files:
            os.ftruncate(fd, per)
            maps.append(mmap.mmap(fd, per, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE))
        bases = [address(m) for m in maps]

        def w(s, e, t):
            j, off = (s // RANGE) % k, (s // RANGE) // k * RANGE
            if t < k:
                for o in range(0, e - s, BLK):
                    self._put(files[j][0], off + o)
            else:
                self._copy_into(bases[j] + off, 0, e - s)

        t = run_ranges(self.n, self.ranges, w)
        for m in maps:
            m.close()
        for fd, p in files:
            self._drop(fd, p)
        return t

    def pwrite_one(self) -> float:
        fd, p = self._fresh("one")

        def w(s, e, _):
            for o in range(s, e, BLK):
                self._put(fd, o, min(BLK, e - o))

        t = run_ranges(self.n, self.ranges, w)
        self._drop(fd, p)
        return t

    def fallocate(self) -> float:
        fd, p = self._fresh("falloc")
        t0 = time.perf_counter()
        os.posix_fallocate(fd, 0, self.size)
        t = time.perf_counter() - t0
        self._drop(fd, p)
        return t

    def mapped(self, alloc: str, pwriters: int = 0) -> float:
        """alloc: "whole" (one fallocate, timed with the copy), "range" (each thread its range),
        "ahead" (one thread allocates the ranges in order while the others copy into those already
        allocated), "faults" (none); "copy only": the copy into pages allocated before the clock.
        `pwriters`: that many threads pwrite() their ranges instead (the inode lock, no faults)."""
        fd, p = self._fresh("mapped")
        if alloc == "copy only":
            os.posix_fallocate(fd, 0, self.size)
        t0 = time.perf_counter()
        if alloc == "whole":
            os.posix_fallocate(fd, 0, self.size)
        elif alloc != "copy only":
            os.ftruncate(fd, self.size)
        m = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = address(m)
        if alloc == "ahead":
            done = [threading.Event() for _ in self.ranges]

            def allocator():
                for k, (s, e) in enumerate(self.ranges):
                    os.posix_fallocate(fd, s, e - s)
                    done[k].set()

            ta = threading.Thread(target=allocator)
            ta.start()

        def w(s, e, t):
            if alloc == "range":
                os.posix_fallocate(fd, s, e - s)
            elif alloc == "ahead":
                done[s // RANGE].wait()
            if t < pwriters:
                for o in range(s, e, BLK):
                    self._put(fd, o, min(BLK, e - o))
            else:
                self._map_put(view, base, s, e)

        view = memoryview(m)
        run_ranges(self.n, self.ranges, w)
        if alloc == "ahead":
            ta.join()
        t = time.perf_counter() - t0
        view.release()
        m.close()
        self._drop(fd, p)
        return t

    def cases(self) -> dict:
        return {
            "memory, touched": lambda: self.memory(True),
            "memory, fresh pages": lambda: self.memory(False),
            "tmpfs pwrite, a file each": self.pwrite_each,
            "tmpfs pwrite, one file": self.pwrite_one,
            **(
                dict(
                    zip(
                        k_files(self.files)[:2],
                        (lambda: self.pwrite_files(self.files), lambda: self.files_both(self.files)),
                    )
                )
                if self.files > 1
                else {}
            ),
            "tmpfs fallocate, one call": self.fallocate,
            "tmpfs mapped, fallocate whole": lambda: self.mapped("whole"),
            "tmpfs mapped, fallocate per range": lambda: self.mapped("range"),
            "tmpfs mapped, faults allocate": lambda: self.mapped("faults"),
            "tmpfs mapped, an allocator ahead": lambda: self.mapped("ahead"),
            "tmpfs mapped, copy only (allocated)": lambda: self.mapped("copy only"),
            "tmpfs mapped + 1 pwrite, copy only": lambda: self.mapped("copy only", 1),
            "tmpfs mapped + 2 pwrite, copy only": lambda: self.mapped("copy only", 2),
            **(self.copy_cases() if self.sfd is not None else {}),
        }

    def copy_cases(self) -> dict:
        """The same writes with the bytes read from `source` (in the page cache) on the way: what
        a copier without a checksum can reach, the copier's own method among them."""

        def copy(fn):
            def run():
                self.copying = True
                try:
                    return fn()
                finally:
                    self.copying = False

            return run

        out = dict(
            zip(
                COPY_ONE_FILE,
                (
                    copy(lambda: self.mapped("whole", 1)),
                    copy(lambda: self.mapped("whole")),
                    copy(self.pwrite_one),
                ),
            )
        )
        out[COPY_EACH] = copy(self.pwrite_each)
        if self.files > 1:
            out[k_files(self.files)[2]] = copy(lambda: self.pwrite_files(self.files))
        return out

    def close(self) -> None:
        self.buf.close()
        if self.sfd is not None:
            os.close(self.sfd)
        os.rmdir(self.dir)


def measure(
    tmpfs: str, size_gb: float, threads: int, rounds: int = 3, only=None, files: int = 0, source=None
) -> dict:
    """{case: best GB/s over `rounds`} (best: the ceiling is what the machine can do). `source`: a
    file in the page cache to copy from, which adds the "copy:" cases."""
    size = max(RANGE, int(size_gb * 1e9) // RANGE * RANGE)
    f = Fill(tmpfs, size, threads, files, source)
    out = {}
    try:
        for name, fn in f.cases().items():
            if only and name not in only:
                continue
            out[name] = max(size / fn() / 1e9 for _ in range(rounds))
    finally:
        f.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=4.0, help="GB per case (default 4)")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 2))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--files", type=int, default=0, help="also: pwrite into this many files (a layout's shards)"
    )
    ap.add_argument("--source", help="also: the copy cases, reading this file (keep it in the page cache)")
    ap.add_argument("--tmpfs", default="/dev/shm")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    out = measure(a.tmpfs, a.size, a.threads, a.rounds, files=a.files, source=a.source)
    print(f"{a.size:g} GB, {a.threads} threads, best of {a.rounds}, into {a.tmpfs}")
    for k, v in out.items():
        print(f"  {k:36} {v:7.2f} GB/s")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump({"size_gb": a.size, "threads": a.threads, "tmpfs": a.tmpfs, "gb_s": out}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
