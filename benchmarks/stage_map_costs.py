#!/usr/bin/env python3
"""What each step of writing one big tmpfs file costs, alone (issue 41): the input of the mapped
writer's choice (provision/stage/readers.py map_span) and its size threshold.

For one file of --size GB in --tmpfs, with N threads each on its own 64 MiB ranges:
  fallocate        posix_fallocate of the whole file (page allocation, one call, the inode lock)
  populate         MADV_POPULATE_WRITE of each range of a fallocated file (zeroing + page tables)
  memcpy-mapped    copying 1 MiB blocks into an already populated mapping
  pread-mapped     preadv from a page-cached source file straight into the populated mapping
  xxh3-mapped      hashing the mapping (1 MiB slices)
  pwrite 1 / N     pwrite of 1 MiB blocks into one file by 1 and by N threads (the inode lock)
  whole-mapped     fallocate + populate + preadv + xxh3 per range (map_span's steps) by N threads

    python3 benchmarks/stage_map_costs.py --size 4 --threads 16
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import threading
import time

RANGE = 64 << 20
BLK = 1 << 20
POP = getattr(mmap, "MADV_POPULATE_WRITE", 23)
try:
    import xxhash
except ImportError:
    xxhash = None


def par(n: int, ranges: list, fn) -> float:
    it = iter(ranges)
    lock = threading.Lock()

    def run():
        while True:
            with lock:
                r = next(it, None)
            if r is None:
                return
            fn(*r)

    ts = [threading.Thread(target=run) for _ in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tmpfs", default="/dev/shm")
    a = ap.parse_args()
    size = int(a.size * 1e9) // RANGE * RANGE
    n = a.threads
    d = tempfile.mkdtemp(prefix="mapcost-", dir=a.tmpfs)
    src = os.path.join(d, "src")
    block = os.urandom(BLK)
    with open(src, "wb") as f:  # a cached source: in the tmpfs itself (the page cache's speed)
        for _ in range(size // BLK):
            f.write(block)
    ranges = [(o, min(size, o + RANGE)) for o in range(0, size, RANGE)]
    gb = size / 1e9
    out = {}

    def fresh(name):
        p = os.path.join(d, name)
        return os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600), p

    sfd = os.open(src, os.O_RDONLY)
    # fallocate alone
    fd, p = fresh("a")
    t0 = time.perf_counter()
    os.posix_fallocate(fd, 0, size)
    out["fallocate (1 call)"] = time.perf_counter() - t0
    maps = {}

    def populate(s, e):
        m = mmap.mmap(fd, e - s, offset=s)
        m.madvise(POP)
        maps[s] = m

    out["populate"] = par(n, ranges, populate)

    def memcpy(s, e):
        mv = memoryview(maps[s])
        for o in range(0, e - s, BLK):
            mv[o : o + BLK] = block
        mv.release()

    out["memcpy-mapped"] = par(n, ranges, memcpy)

    def pread(s, e):
        mv = memoryview(maps[s])
        for o in range(0, e - s, BLK):
            os.preadv(sfd, [mv[o : o + BLK]], s + o)
        mv.release()

    out["pread-mapped"] = par(n, ranges, pread)
    if xxhash is not None:

        def hsh(s, e):
            mv = memoryview(maps[s])
            h = xxhash.xxh3_64()
            for o in range(0, e - s, BLK):
                h.update(mv[o : o + BLK])
            mv.release()

        out["xxh3-mapped"] = par(n, ranges, hsh)
    for m in maps.values():
        m.close()
    os.close(fd)
    os.unlink(p)

    def pwrite_run(k):
        fd, p = fresh("w")

        def w(s, e):
            buf = bytearray(BLK)
            mv = memoryview(buf)
            for o in range(s, e, BLK):
                os.preadv(sfd, [mv], o)
                os.pwrite(fd, mv, o)

        t = par(k, ranges, w)
        os.close(fd)
        os.unlink(p)
        return t

    out["pwrite+pread 1 thread"] = pwrite_run(1)
    out[f"pwrite+pread {n} threads"] = pwrite_run(n)

    def whole_run(k):
        fd, p = fresh("m")

        def w(s, e):
            os.posix_fallocate(fd, s, e - s)
            m = mmap.mmap(fd, e - s, offset=s)
            mv = memoryview(m)
            h = xxhash.xxh3_64() if xxhash else None
            for o in range(0, e - s, BLK):
                m.madvise(POP, o, BLK)
                os.preadv(sfd, [mv[o : o + BLK]], s + o)
                if h:
                    h.update(mv[o : o + BLK])
            mv.release()
            m.close()

        t = par(k, ranges, w)
        os.close(fd)
        os.unlink(p)
        return t

    out[f"mapped steps {n} threads"] = whole_run(n)

    def one_map_run(k):  # one mapping of the whole file, faults on first touch (no populate, no munmap churn)
        fd, p = fresh("o")
        os.posix_fallocate(fd, 0, size)
        m = mmap.mmap(fd, size)
        mv = memoryview(m)

        def w(s, e):
            for o in range(s, e, BLK):
                os.preadv(sfd, [mv[o : o + BLK]], o)

        t = par(k, ranges, w)
        mv.release()
        m.close()
        os.close(fd)
        os.unlink(p)
        return t

    out[f"one mapping, faults {n} thr"] = one_map_run(n)

    def many_files_run(k):  # the same bytes by k threads into k files: the per-file lock out of the way
        fds = [fresh(f"f{i}") for i in range(k)]

        def w(s, e):
            fd = fds[(s // RANGE) % k][0]
            buf = bytearray(BLK)
            mv = memoryview(buf)
            for o in range(s, e, BLK):
                os.preadv(sfd, [mv], o)
                os.pwrite(fd, mv, o)

        t = par(k, ranges, w)
        for fd, p in fds:
            os.close(fd)
            os.unlink(p)
        return t

    out[f"pwrite {n} thr into {n} files"] = many_files_run(n)
    for k, t in out.items():
        print(f"{k:28} {t:7.3f} s  {gb / t:7.2f} GB/s")
    os.close(sfd)
    os.unlink(src)
    os.rmdir(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
