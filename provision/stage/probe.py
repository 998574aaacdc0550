"""How a run reads its source: the share of it in the page cache, and for a cold source (after a
reboot) a short probe of O_DIRECT against buffered reads whose verdict is kept (verdicts.py).

A cold source (mostly not in the page cache) is read with at least COLD_THREADS threads whatever
the core count (a thread blocked in a read holds no core), either with O_DIRECT in DIRECT_BLOCK
reads or buffered (the kernel's readahead along each worker's span), whichever a short probe
measured faster on this box (readers.py says why both). The probe's reads are the copy's own
first bytes of the ranges it times, and its verdict is kept per source filesystem on persistent
storage (verdicts.remember), so the next cold run probes nothing.

A source in the page cache gets WRITERS_PER_FILE copy threads per multi-range file (at most
`workers`), as tmpfs's inode lock makes a file's second writer spin: 8 GB in 8 shards on 16
cores, 16 threads took 9.3 CPU-s, 12 threads 7.4 and 8 threads 6.2, for 0.79, 0.80 and 0.93 s.
"""

from __future__ import annotations

import errno
import math
import os
import time

from . import readers, sizes
from .hashing import CHUNK_HASH
from .readers import copy_span, direct_fd, open_src
from .room import mount_of
from .schedule import FileJob
from .threads import run_tasks
from .verdicts import remember, remembered

# at least this many copy threads for a cold source, so that enough reads are in flight whatever
# the core count (a thread blocked in a read holds no GIL and no core)
COLD_THREADS = max(1, int(os.environ.get("GPUBOX_STAGE_COLD_THREADS") or 16))
# per thread and phase: the first bytes of a range, copied by the probe (GPUBOX_STAGE_PROBE_MIB;
# at most a range)
PROBE_BYTES = min(64, max(1, int(os.environ.get("GPUBOX_STAGE_PROBE_MIB") or 8))) << 20
# O_DIRECT is taken only when the probe finds it this much faster: its short reads understate what
# buffered reads reach over a whole run (the kernel's readahead grows along a stream), and overstate
# O_DIRECT. Measured on the 16-core device VM (12 GB cold, three leases; benchmarks/results/stage.md
# run R): the 8 MiB probe put O_DIRECT at 0.95-1.32x buffered, while whole runs read buffered at
# 1.30-1.35x O_DIRECT's rate (2.40 against 1.84 GB/s in one lease); with 1.15 the probe once chose
# O_DIRECT and that run, and every run after it that kept the verdict, copied at 0.72 of the disk.
# 32 MiB pieces misled it more (1.76-1.83x). A box where O_DIRECT pays (page-cache insertion the
# limit, fast NVMe) shows it far beyond this margin.
DIRECT_MARGIN = 1.5
PROBE_PHASES = ("direct", "buffered", "buffered", "direct")  # a drift of the device hits both alike
# copy threads per file for a cached source (ColdProbe._cached_threads)
WRITERS_PER_FILE = max(1.0, float(os.environ.get("GPUBOX_STAGE_WRITERS_PER_FILE") or 1.5))


def judge(rates: dict, kept: str = "buffered") -> str:
    """The read path a probe's rates ({"direct": GB/s, "buffered": GB/s}) choose: O_DIRECT only
    DIRECT_MARGIN ahead. `kept`: the verdict stored with rates that cannot be read as figures."""
    try:
        return "direct" if float(rates["direct"]) > DIRECT_MARGIN * float(rates["buffered"]) else "buffered"
    except (TypeError, KeyError, ValueError):
        return kept


def read_mode_setting() -> str:
    """GPUBOX_STAGE_DIRECT: auto (probe, the default) | 1 (O_DIRECT for uncached ranges) | 0 (buffered)."""
    v = os.environ.get("GPUBOX_STAGE_DIRECT", "auto").strip().lower()
    return {"1": "direct", "0": "buffered"}.get(v, "auto")


class ColdProbe:
    """The Copier's choice of read path and thread count (a part of copier.Copier, kept here as
    its own idea). Uses the copier's src, algo, workers, advance, jlock and setting, and sets its
    `read` (the summary's figures), `direct` (O_DIRECT still allowed) and `direct_bytes`."""

    def _cold_share(self, jobs: list[FileJob]) -> tuple[float, list]:
        """Share of the bytes to copy that are not in the page cache, and the ranges whose first
        PROBE_BYTES are uncached (job, range): where the probe may copy (not a whole-file job, not a
        range an interrupted run left to resume)."""
        total = uncached = 0
        ranges = []
        for j in jobs:
            size = j.info["size"]
            try:
                fd = os.open(j.spath, os.O_RDONLY)
            except OSError:
                continue
            try:
                c = readers.cached_bytes(fd, 0, size)
                if c is None:
                    return 0.0, []
                total += size
                uncached += max(0, size - c)
                if j.whole:
                    continue
                for i in range(j.n):
                    lo = i * sizes.CHUNK
                    if i in j.resume or lo + PROBE_BYTES > size:
                        continue
                    # a shard's first range holds its header, which the integrity check just read
                    # (a few pages, and the readahead after them): still a cold range to time
                    if (readers.cached_bytes(fd, lo, PROBE_BYTES) or 0) <= PROBE_BYTES // 16:
                        ranges.append((j, i))
            finally:
                os.close(fd)
        return (uncached / total if total else 0.0), ranges

    def _choose_read(self, jobs: list[FileJob]) -> int:
        """How to read this run's source, and with how many threads (returned)."""
        cold, ranges = self._cold_share(jobs)
        if cold < 0.5:
            self._map_big_files(jobs)
            self.read["threads"] = self._cached_threads(jobs)
            return self.read["threads"]
        threads = max(self.workers, COLD_THREADS)
        mode = self.setting if self.direct else "buffered"  # O_DIRECT: local block filesystems only
        self.read = {"mode": mode, "threads": threads, "cold_share": round(cold, 3)}
        if mode == "auto":
            big = len(ranges) >= 4 * threads  # enough uncached ranges for four phases at full depth
            known = remembered(self.src, threads) if big else None
            if known is not None:  # this filesystem's verdict from an earlier cold run (remember)
                # judged again by this version's margin: a verdict kept by an older one (1.15) may
                # have taken O_DIRECT on rates that no longer do
                rates = known["probe_gb_s"]
                self.read.update(mode=judge(rates, known["mode"]), probe_gb_s=rates, probed_at=known["at"])
            elif big:
                step = len(ranges) / (4 * threads)
                pick = [ranges[int(k * step)] for k in range(4 * threads)]
                rates = self._probe(pick, threads)
                self.read["probe_gb_s"] = {k: round(v, 3) for k, v in rates.items()}
                self.read["mode"] = judge(self.read["probe_gb_s"])  # the rates kept: judged alike again
                if min(rates.values()) > 0:  # both paths worked: a verdict worth keeping
                    remember(self.src, threads, self.read["mode"], self.read["probe_gb_s"])
            else:  # too little to measure: read as cp does. Buffered won every measurement so
                # far: all probes on the 16-core device VM, and 2 GB on a 2-core VM (0.94x `cp -r`
                # against 1.17x with O_DIRECT, benchmarks/results/stage.md); the page cache it fills is small
                self.read["mode"] = "buffered"
        if self.read["mode"] == "buffered":
            self.direct = False
        return threads

    def _map_big_files(self, jobs: list[FileJob]) -> None:
        """Mark the big files that are written through a shared mapping (readers.map_span), past
        the tmpfs inode lock: only for a cached source (from the disk, the disk sets the pace and
        the mapping's page faults only cost: one 12 GB file cold on the 16-core device VM, 0.90 of
        the disk's read rate mapped against 1.06 with pwrite, one big shard beside small files 0.69
        against 0.85; benchmarks/results/stage.md run R), and only into tmpfs (MAP_FS: on a disk,
        writes of one file do not queue the same way)."""
        typ, opts = mount_of(self.dest)
        if readers.MAP_MIN is None or typ not in readers.MAP_FS:
            return
        big = [j for j in jobs if j.info["size"] >= max(1, readers.MAP_MIN)]
        if not readers.MAP_AUTO or readers.map_pays(len(big), self.workers, opts):
            for j in big:
                j.mapped = True

    def _cached_threads(self, jobs: list[FileJob]) -> int:
        """Copy threads for a source in the page cache: 1.5 per file of more than one range
        (WRITERS_PER_FILE), at most `workers`, at least 2; threads whose file is done join the
        others' (schedule.Schedule), so the last shard is still split. Why not one per range: tmpfs holds
        the inode lock for each write to a file, and a second writer spins on it; why more than one
        per file: the reads and checksums of a second writer overlap the first one's writes.
        Measured on the 16-core device VM, 8 GB in 8 shards, warm, 5 rounds
        (benchmarks/results/stage.md, run H): 8 threads 0.93 s / 6.2 CPU-s, 12 threads 0.80 s /
        7.4 CPU-s, 16 threads 0.79 s / 9.3 CPU-s (`xargs -P16 cp` 0.81 s / 4.7, `cp -r` 4.3 CPU-s)."""
        multi = sum(1 for j in jobs if (j.n > 1 and not j.mapped) or j.whole)
        # a file written through a shared mapping (readers.map_span) takes no inode lock per write:
        # a writer for each of its ranges, up to `workers` (with 1.5 per file, one mapped 6 GB file
        # got 2 threads and copied no faster than pwrite, 16-core device VM)
        mapped = sum(j.n for j in jobs if j.mapped and j.n > 1 and not j.whole)
        return min(self.workers, max(2, math.ceil(WRITERS_PER_FILE * multi) + mapped))

    def _probe(self, pick: list[tuple[FileJob, int]], threads: int) -> dict:
        """Time the two cold read paths on this box: `threads` readers at once, each copying the
        first PROBE_BYTES of one uncached range, O_DIRECT in DIRECT_BLOCK reads or buffered (with
        PREFETCH ahead where set), in four phases (PROBE_PHASES). What the probe reads is the copy's own
        first bytes of those ranges: written into the partial and hashed, the hash kept on the job
        (job.heads), so the copy goes on from there and no byte is read twice (the probe that read
        pieces apart from the copy cost ~8% of an 8 GB cold run on the device VM,
        benchmarks/results/stage.md).
        A piece that failed (O_DIRECT refused) keeps no head: its range is copied whole later.
        Returns {"direct": GB/s, "buffered": GB/s} (a mode that failed: 0)."""
        q = len(pick) // len(PROBE_PHASES)
        spent = {"direct": 0.0, "buffered": 0.0}
        moved = dict.fromkeys(spent, 0)
        failed: set = set()
        for k, mode in enumerate(PROBE_PHASES):

            def head(job: FileJob, i: int, mode=mode) -> None:
                job.open()
                start = i * sizes.CHUNK
                fd = direct_fd(job.spath, job.ident) if mode == "direct" else open_src(job.spath, job.ident)
                if fd is None:
                    failed.add(mode)
                    return
                h = CHUNK_HASH[self.algo]()
                # buffered: the whole piece asked of the kernel at once (POSIX_FADV_WILLNEED), as
                # a stream's readahead has it in flight once it has grown; without that an 8 MiB
                # piece from a fresh fd times the readahead's ramp (16-core device VM, 16 GB:
                # 0.51 GB/s buffered against 1.23 O_DIRECT, and the copy then read O_DIRECT at
                # 1.29 GB/s where buffered reached 1.71; benchmarks/results/stage.md run L)
                how = {"block": sizes.DIRECT_BLOCK} if mode == "direct" else {"prefetch": PROBE_BYTES}
                try:
                    copy_span(
                        h,
                        fd,
                        job.dfd,
                        start,
                        start + PROBE_BYTES,
                        advance=self.advance,
                        wlock=job.wlock,
                        **how,
                    )
                except OSError as exc:
                    if exc.errno != errno.EINVAL or mode != "direct":
                        raise
                    failed.add(mode)  # O_DIRECT refused at read time
                    return
                finally:
                    os.close(fd)
                with job.lock:
                    job.heads[i] = (h, PROBE_BYTES)
                if mode == "direct":
                    with self.jlock:
                        self.direct_bytes += PROBE_BYTES

            t0 = time.perf_counter()
            run_tasks([lambda a=a: head(*a) for a in pick[k * q : (k + 1) * q]], threads)
            spent[mode] += time.perf_counter() - t0
            moved[mode] += q * PROBE_BYTES
        return {m: 0.0 if m in failed or spent[m] <= 0 else moved[m] / spent[m] / sizes.GB for m in spent}
