"""The copier: worker threads copy the ranges the schedule hands out, checksumming each slice as
it is written, journal every range and every finished file, and rename each file into place when
its last range is done (checking that the source did not change meanwhile).

Every file is cut into 64 MiB ranges; worker threads read each range with preadv through a 1 MiB
per-thread buffer, pwrite the slice and hash it while it is still in the CPU cache (readers.py
says why plain reads); the schedule (schedule.py) spreads them over files, then splits large
shards; how the source is read, and with how many threads, is the probe's choice (probe.py).
docs/stage.md "Performance" has the goals, benchmarks/stage_vs_cp.py the run,
benchmarks/results/stage.md the figures.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading

from . import readers, sizes
from .errors import StageError
from .hashing import HASH_ALGO, chunk, tree
from .manifest import JOURNAL
from .probe import ColdProbe, read_mode_setting
from .readers import DIRECT_FS, PREFETCH, NoRoom, Streams, direct_fd, open_src
from .room import fstype, statvfs_free
from .schedule import FileJob, Schedule
from .threads import run_tasks


class Copier(ColdProbe):
    """Copies `files` from src to dest (run()); `done` holds the finished files' manifest entries."""

    def __init__(
        self,
        src: str,
        dest: str,
        files: dict[str, dict],
        *,
        workers: int,
        sync: bool,
        algo: str = HASH_ALGO,
        advance=None,
        on_file=None,
        resume: dict[str, dict[int, bytes]] | None = None,
    ):
        self.src, self.dest, self.files, self.algo = src, dest, files, algo
        self.workers, self.sync, self.advance, self.on_file = workers, sync, advance, on_file
        self.resume = resume or {}
        self.jlock = threading.Lock()
        fd = os.open(
            os.path.join(dest, JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644
        )
        self.journal = os.fdopen(fd, "a")
        self.done: dict[str, dict] = {}
        self.setting = read_mode_setting()
        self.direct = hasattr(os, "O_DIRECT") and fstype(src) in DIRECT_FS and self.setting != "buffered"
        self.direct_bytes = 0  # read with O_DIRECT (the summary's read_direct_bytes)
        self.resumed_bytes = 0  # kept from an interrupted run's partials (re-hashed, not re-read)
        # "cached": the source is in the page cache (read buffered); "direct"/"buffered": how an
        # uncached range is read, from the probe or GPUBOX_STAGE_DIRECT
        self.read = {"mode": "cached", "threads": workers}

    def run(self) -> dict[str, dict]:
        jobs = [
            FileJob(self.src, self.dest, r, self.files[r], self.resume.get(r))
            for r in sorted(self.files, key=lambda r: -self.files[r]["size"])
        ]
        for j in jobs:
            os.makedirs(os.path.dirname(j.dpath), exist_ok=True)
        sched = Schedule(jobs)
        try:
            threads = self._choose_read(jobs)  # a cold probe copies into the partials: inside the try
            run_tasks(
                [self._worker(sched, k) for k in range(min(threads, sum(j.n for j in jobs)) or 1)],
                threads,
                abort=lambda: setattr(sched, "stop", True),
            )
        except NoRoom as exc:
            raise self._full(exc) from None
        except OSError as exc:  # the journal, a directory: the same full filesystem
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._full(NoRoom(exc.strerror)) from None
            raise
        finally:
            sched.stop = True
            for j in jobs:
                j.close()
                if not j.finished:  # no half-copied file stays behind to fill the tmpfs
                    try:
                        os.unlink(j.partial)
                    except FileNotFoundError:
                        pass
            self.journal.close()
        return self.done

    def _full(self, exc: NoRoom) -> StageError:
        free = statvfs_free(self.dest)
        return StageError(
            f"destination {self.dest} is full ({exc}; {sizes.size_text(free)} free on its filesystem); "
            f"the unfinished files were removed, {len(self.done)} finished file(s) kept",
            "free space on the destination (or raise the tmpfs size), then re-run to resume",
        )

    def _worker(self, sched: Schedule, k: int = 0):
        def run():
            span, streams = None, Streams()
            streams.pwriter = k < readers.MAP_PWRITERS
            try:
                while (t := sched.take(span)) is not None:
                    span, i = t
                    self._copy(span.job, i, streams)
            except BaseException:
                sched.stop = True
                raise
            finally:
                streams.close()

        return run

    def _reader(self, job: FileJob, start: int, end: int, streams: Streams) -> tuple[int, dict]:
        """An fd to read [start, end) of the source (the worker's own, kept along its span) and how
        (hashing.chunk's block/prefetch): O_DIRECT, or buffered with prefetch, when most of it is not
        cached (by the probe's choice), else buffered."""

        def buffered() -> int:
            return open_src(job.spath, job.ident)

        if (
            self.read["mode"] != "cached" and job.info["size"] >= sizes.BUF
        ):  # small files: not worth a 2nd open
            cached = readers.cached_bytes(job.sfd, start, end - start)
            if cached is not None and cached < (end - start) // 2:
                if self.direct:
                    fd = streams.get(job, "direct", lambda: direct_fd(job.spath, job.ident))
                    if fd is not None:
                        with self.jlock:
                            self.direct_bytes += end - start
                        return fd, {"block": sizes.DIRECT_BLOCK}
                    self.direct = False  # refused here: the rest is read buffered
                return streams.get(job, "buffered", buffered), {"prefetch": PREFETCH}
        return streams.get(job, "buffered", buffered), {}

    def _kept(self, job: FileJob, i: int, start: int, end: int) -> bool:
        """Range i of an interrupted run's partial, re-hashed: True when it holds what was journaled."""
        fd = os.open(job.partial, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < end:
                return False
            ok = chunk(fd, None, start, end, self.algo) == job.resume[i]
        except StageError:  # shorter than journaled
            return False
        finally:
            os.close(fd)
        if ok:
            with self.jlock:
                self.resumed_bytes += end - start
            if self.advance:
                self.advance(end - start)
        return ok

    def _copy(self, job: FileJob, i: int | None, streams: Streams) -> None:
        job.open()
        if i is None:  # whole file, sequentially, with the hub's sha256 alongside
            whole = hashlib.sha256()
            for k in range(job.n):
                start, end = k * sizes.CHUNK, min(job.info["size"], (k + 1) * sizes.CHUNK)
                fd, how = self._reader(job, start, end, streams)
                job.digests[k] = chunk(
                    fd,
                    job.dfd,
                    start,
                    end,
                    self.algo,
                    extra=whole,
                    advance=self.advance,
                    wlock=job.wlock,
                    view=None if streams.pwriter else job.view,
                    **how,
                )
            self._finish(job, whole.hexdigest())
            return
        start, end = i * sizes.CHUNK, min(job.info["size"], (i + 1) * sizes.CHUNK)
        if i in job.resume and self._kept(job, i, start, end):
            job.digests[i] = job.resume[i]
        else:
            h, done = job.heads.pop(i, (None, 0))  # the probe's first bytes of this range
            fd, how = self._reader(job, start + done, end, streams)
            try:
                job.digests[i] = chunk(
                    fd,
                    job.dfd,
                    start + done,
                    end,
                    self.algo,
                    advance=self.advance,
                    h=h,
                    wlock=job.wlock,
                    view=None if streams.pwriter else job.view,
                    **how,
                )
            except OSError as exc:
                if exc.errno != errno.EINVAL or "block" not in how:
                    raise
                self.direct = False  # O_DIRECT refused at read time: this chunk again, buffered
                streams.drop("direct")
                fd, _ = self._reader(job, start, end, streams)
                job.digests[i] = chunk(fd, job.dfd, start, end, self.algo, wlock=job.wlock, view=job.view)
            if job.n > 1:
                self._journal_range(job, i)
        with job.lock:
            job.left -= 1
            last = job.left == 0
        if last:
            self._finish(job, None)

    def _journal_range(self, job: FileJob, i: int) -> None:
        """Record range i as written (resume after a kill picks it up from NAME.partial). On a disk
        destination its bytes are on the disk first; on tmpfs a kill loses nothing written."""
        if self.sync:
            os.fdatasync(job.dfd)
        rec = {
            "rel": job.rel,
            "range": i,
            "digest": job.digests[i].hex(),
            "size": job.info["size"],
            "mtime_ns": job.info["mtime_ns"],
            "algo": self.algo,
        }
        with self.jlock:
            self.journal.write(json.dumps(rec) + "\n")
            self.journal.flush()

    def _finish(self, job: FileJob, sha: str | None) -> None:
        info = job.info
        try:  # the name still leads to the inode that was copied (a worker reads through one fd)
            now = os.stat(job.spath)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != job.ident:
            raise StageError(
                f"source file {job.rel} was removed or replaced during the copy",
                "re-run when the source is stable",
            )
        st = os.fstat(job.sfd)
        if st.st_size != info["size"] or st.st_mtime_ns != info["mtime_ns"]:
            raise StageError(
                f"source file {job.rel} changed during the copy", "re-run when the source is stable"
            )
        if sha is not None and sha != info["hub_sha256"]:
            raise StageError(
                f"{job.rel}: sha256 {sha[:12]}.. differs from the hub's {info['hub_sha256'][:12]}..",
                "the cached blob is corrupt: delete it from the HF cache and download again",
            )
        os.fchmod(job.dfd, info.get("mode", 0o644))  # the source's permissions, not the umask's
        os.ftruncate(job.dfd, info["size"])  # a resumed partial may be longer than the source now
        if self.sync:
            os.fsync(job.dfd)
        job.close()
        os.utime(job.partial, ns=(info["mtime_ns"], info["mtime_ns"]))
        os.replace(job.partial, job.dpath)
        job.finished = True
        entry = {
            "rel": job.rel,
            "size": info["size"],
            "mtime_ns": info["mtime_ns"],
            "hash": tree(job.digests),
            "algo": self.algo,
        }
        if job.n > 1:  # per range: --verify names the damaged byte ranges
            entry["ranges"] = [d.hex() for d in job.digests]
        if sha is not None:
            entry["sha256"] = sha
        with self.jlock:
            self.journal.write(json.dumps(entry) + "\n")
            self.journal.flush()
            self.done[job.rel] = entry
        if self.on_file:
            self.on_file(job.rel)
