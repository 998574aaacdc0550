"""Stage a model directory into tmpfs (/dev/shm): fast, hash-verified, atomic, resumable.

Stdlib only (rich and xxhash are optional and imported where present) so the same file can run
inside a container that has no gpubox: as a payload (gpubox.transport.payload: this module and
safetensors_check, zipped, run with the container's python3). With a local transport gpubox calls
`run_request()` in-process on paths under the container's root prefix.

Which checksum, and why XXH3 by default:
- The threat is accidental: a copy from trusted local storage that was cut short, truncated, or
  had bits flipped (a bad disk/NFS read, a crash mid-copy), not an adversary who forges content.
  Storage systems check exactly this with fast non-cryptographic checksums: ZFS's default
  checksum is fletcher4, GCS and S3 use CRC32C per object/part. So the default is XXH3-64 per
  64 MiB range ("xxh3-tree-64MiB", python-xxhash, a dependency): measured from 1 MiB buffers, one
  thread, best of 7 on the loaded 2-core dev machine: xxh3 25.8 GB/s, crc32c (crc32c package) 6.3,
  BLAKE3 1.4, zlib.crc32 1.3, sha256 (SHA-NI) 0.4; all of them release the GIL. At that rate the
  checksum is ~2% of a copy's CPU; crc32 was ~25%, sha256 ~45%. google-crc32c was not taken: it
  refuses a writable buffer (our reads land in one), so it would need a copy.
- Where xxhash is missing (the standalone payload in a bare container) the default is zlib.crc32
  ("crc32-tree-64MiB"); `hash="sha256"` ("sha256-tree-64MiB") stays for who wants a cryptographic
  digest of the staged copy.
- A Hugging Face cache source is still checked against the hub's sha256 (the LFS blob name)
  whatever the chunk hash: that sequential whole-file sha256 is the hub's own identity check.
- Every file entry records its algorithm ("algo"); --verify, resume/skip and check use the entry's
  own algorithm, so a directory staged with sha256 stays staged (and verifiable) when xxh3 is the
  request, and vice versa. Only changed files are re-copied (with the requested algorithm). An entry
  whose algorithm cannot be computed here (xxh3 without xxhash) passes the cheap check, and --verify
  re-copies it with one that can.

How it copies, and why (docs/stage.md "Performance" has the figures, benchmarks/stage_vs_cp.py the run):
- Every file is cut into 64 MiB chunks; worker threads read each chunk with preadv through a 1 MiB
  per-thread buffer, pwrite the slice and hash it while it is still in the CPU cache. Measured on 32
  cores (16 GB, warm): the earlier mmap of each source chunk cost 77 CPU-s (78k minor faults,
  4.8 CPU-s/GB, 10x cp) for 2.8 GB/s; plain reads 19 CPU-s (1.2 CPU-s/GB, 2.4x cp) for 11.6 GB/s,
  as fast as `xargs -P32 cp`. 256 KiB slices measured the same on 2 cores but 296k context
  switches (GIL hand-offs between 16 threads) and 1.4x the wall on 32 cores; 4 MiB fall out of L2.
- Plain reads cannot SIGBUS: a source truncated under the copy gives a short read, which is the
  "source shrank" error (a read of a mapping past a new EOF kills the process with SIGBUS).
- tmpfs takes the inode lock for every write to a file, so writers of one file queue: _Schedule
  spreads workers over files first, then splits the large shards across workers by stealing the
  back half of the longest stretch left (each pwrite()s into the one NAME.partial at its offsets),
  so the last big shard is not left to one stream. Each worker reads its stretch of a file through
  one open file of its own (POSIX_FADV_SEQUENTIAL), so the kernel's readahead follows each stream
  from range to range, and writers of one file take turns on a lock of ours (asleep, not spinning
  on the inode lock: 16 cores, 16 GB warm, 0.69 against 0.86 CPU-s/GB).
- A cold source (mostly not in the page cache: after a reboot) is read with at least COLD_THREADS
  threads whatever the core count (a thread blocked in a read holds no core), either with O_DIRECT
  in 4 MiB reads or buffered (the kernel's readahead along each worker's span), whichever a
  short probe measured faster on this box (see "reading a cold source" below). The probe's reads
  are the copy's own first bytes of the ranges it times, and its verdict is kept per source
  filesystem on persistent storage (_remember), so the next cold run (the next reboot) probes
  nothing.
- sendfile/copy_file_range cannot hash without a second read (copy_file_range also fails across
  filesystems: EXDEV); sendfile + hashing the destination measured slower (1.27 vs 0.68 CPU-s/GB
  on 2 cores), and so did preadv straight into an mmap of the destination (page faults: 1.17).
  sendfile in 8 MiB calls + hashing from a MAP_POPULATE mapping of the destination (no faults
  per page) was slower on 16 cores too: 8 GB warm 1.29 s against 0.83 s, the same CPU.
- A source in the page cache gets 1.5 copy threads per multi-range file (at most `workers`), as
  tmpfs's inode lock makes a file's second writer spin: 8 GB in 8 shards on 16 cores, 16 threads
  took 9.3 CPU-s, 12 threads 7.4 and 8 threads 6.2, for 0.79, 0.80 and 0.93 s.
- A file's digest is sha256 over its range digests (xxh3: 8 bytes big-endian each, crc32: 4), so
  ranges of one big shard hash in parallel and in any order; a whole-file hash is a sequential
  chain and would leave one core busy with the largest shard at the end. The range digests are
  kept (manifest "ranges"), so --verify names the damaged byte ranges.
- Each file is written as NAME.partial and renamed when complete; a journal
  (.gpubox-journal.jsonl) records every range written and every finished file, so a killed run
  resumes where it stopped, inside a file too (its kept ranges are re-hashed in the partial first);
  the manifest (.gpubox-manifest.json: size, mtime, hash and algo per file; the source's identity)
  is written last, atomically, and the directory only counts as staged when it exists. Before
  changing a staged directory the manifest is removed first (its entries move to the journal).
- An flock on .gpubox-stage.lock keeps a second stager out.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import math
import mmap
import os
import stat
import sys
import threading
import time
import zlib
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

try:  # inside the gpubox package
    from . import safetensors_check as stc
except ImportError:  # run as a plain script (`python3 stage.py`): it sits beside us
    import safetensors_check as stc  # type: ignore[no-redef]

SCHEMA = "gpubox.stage/1"
MANIFEST = ".gpubox-manifest.json"
JOURNAL = ".gpubox-journal.jsonl"
LOCK = ".gpubox-stage.lock"  # as .NAME.gpubox-stage.lock beside the destination
PARTIAL = ".partial"
CHUNK = 64 << 20
# read/hash/write slice: stays in L2 (2-core VM: 256 KiB <= 1 MiB < 4 MiB); the variable is for
# benchmarks/stage_vs_cp.py (BENCH_BUF_KIB) to time other sizes with the same engine
BUF = max(4, int(os.environ.get("GPUBOX_STAGE_BUF_KIB") or 1024)) << 10
# cold source: O_DIRECT reads of this size (the device writes into our buffer; the slices are then
# written and hashed BUF at a time), and at least this many copy threads, so that enough reads are
# in flight whatever the core count (a thread blocked in a read holds no GIL and no core)
DIRECT_BLOCK = max(BUF, int(os.environ.get("GPUBOX_STAGE_DIRECT_KIB") or 4096) << 10) // BUF * BUF
COLD_THREADS = max(1, int(os.environ.get("GPUBOX_STAGE_COLD_THREADS") or 16))
# cold source read buffered: POSIX_FADV_WILLNEED this far ahead of each stream, on top of the kernel's
# readahead. Off (0) by default: measured slower wherever it was tried (16 GB cold on the 16-core
# device VM: 1.55 GB/s with 16 MiB against 1.71 without, 3 rounds of 3; 4 GB on a 2-core VM: 1.27
# against 1.41 GB/s, less CPU without; docs/stage.md run K)
PREFETCH = int(os.environ.get("GPUBOX_STAGE_PREFETCH_KIB") or 0) << 10
# writers of one file take turns on a lock of ours around each pwrite (GPUBOX_STAGE_WRITE_LOCK=0:
# not, for the benchmark): tmpfs holds the inode lock for the whole copy of a write, and a second
# writer spins on it while the holder runs (rwsem optimistic spinning), burning a core for nothing;
# on our lock it sleeps, and its read and checksum still overlap the holder's write
WRITE_LOCK = os.environ.get("GPUBOX_STAGE_WRITE_LOCK", "1").strip() != "0"
_NO_LOCK = contextlib.nullcontext()  # a write lock that is none (reusable)
try:  # python-xxhash (pyproject dependency); the standalone payload may run where it is missing
    import xxhash
except ImportError:  # then crc32 (zlib) is the default and xxh3 entries cannot be re-hashed here
    xxhash = None  # type: ignore[assignment]
# --hash NAME -> algorithm (the name the manifest records)
HASHES = {"xxh3": "xxh3-tree-64MiB", "crc32": "crc32-tree-64MiB", "sha256": "sha256-tree-64MiB"}
DEFAULT_HASH = "xxh3" if xxhash is not None else "crc32"
HASH_ALGO = HASHES[DEFAULT_HASH]
LEGACY_ALGO = HASHES["sha256"]  # entries written before the choice existed carry no "algo"
GB = 1e9
FS_MARGIN = 1 << 30  # keep 1 GiB free on the destination filesystem
MEM_MARGIN = 4 << 30  # and 4 GiB of the container's memory limit for everything else


class StageError(Exception):
    """Staging cannot go on: a problem and how to fix it (gpubox turns it into exit 2)."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB" if abs(n) >= 0.1 * GB else f"{n / 1e6:.1f} MB"


# -- source ----------------------------------------------------------------------------------
HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--", "kernels--")


def _link_roots(src: str) -> list[str]:
    """Where links in src may point: src itself and, for a Hugging Face cache snapshot
    (CACHE/models--ORG--NAME/snapshots/REV), its repo directory (every file links to ../../blobs/)
    and the cache's shared Xet store CACHE/blobs/ (a repo's blobs/<etag> may link there; see
    tests/fixtures/stage/realworld/hf_cache_layouts.txt for the documented layouts)."""
    real = os.path.realpath(src)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots":
        repo = os.path.dirname(parent)
        roots.append(repo)
        if os.path.basename(repo).startswith(HF_REPO_PREFIXES):
            roots.append(os.path.join(os.path.dirname(repo), "blobs"))
    return roots


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def scan(src: str, *, follow_links: bool = False) -> dict[str, dict]:
    """rel path -> {size, mtime_ns, mode[, hub_sha256][, link]} of the regular files under src
    (hidden names skipped: .git, .cache, our own bookkeeping).

    Symlinks inside the source (and a Hugging Face snapshot's links into its blobs/) are followed.
    A link out of the source is refused unless follow_links: a file linked in from elsewhere would
    be copied without anyone having chosen it (then it is followed and named: entry["link"]).
    A directory link back up the tree is refused (a loop)."""
    if not os.path.isdir(src):
        raise StageError(f"source {src} is not a directory", "give the persistent model directory")
    roots = _link_roots(src)
    out: dict[str, dict] = {}
    outside: list[tuple[str, str]] = []
    seen_dirs: set[tuple[int, int]] = set()
    for dirpath, dirs, names in os.walk(src, followlinks=True):
        dst = os.stat(dirpath)
        if (dst.st_dev, dst.st_ino) in seen_dirs:
            raise StageError(
                f"source directory {dirpath} is reached twice through links (a loop, or a "
                f"second link to one directory)",
                "remove the extra directory link from the source",
            )
        seen_dirs.add((dst.st_dev, dst.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in names:
            if n.startswith(".") or n.endswith(PARTIAL):
                continue
            p = os.path.join(dirpath, n)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                raise StageError(f"source file {p} is a broken link", "repair the source directory") from None
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(p, src)
            e = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "mode": stat.S_IMODE(st.st_mode) & 0o777}
            real = os.path.realpath(p)
            if not _inside(real, roots):
                outside.append((rel, real))
                e["link"] = real
            hub = stc.hub_sha256(p)
            if hub:
                e["hub_sha256"] = hub
            out[rel] = e
    if outside and not follow_links:
        rel, real = outside[0]
        raise StageError(
            f"{len(outside)} file(s) in {src} are links out of it, e.g. {rel} -> {real}",
            "copy them into the source, or pass --follow-links to stage what they point at",
        )
    if not out:
        raise StageError(
            f"source {src} has no files", "point at the directory that holds config.json and the shards"
        )
    return out


def fingerprint(files: dict[str, dict]) -> str:
    """Identity of a source: sha256 over (name, size, mtime) of every file."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel]['size']}\0{files[rel]['mtime_ns']}\n".encode())
    return h.hexdigest()


# -- destination state -----------------------------------------------------------------------
def _load_json(path: str):
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError, OSError):
        return None


def _journal_lines(dest: str):
    try:
        with open(os.path.join(dest, JOURNAL), "rb") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by the interruption
                if isinstance(e, dict) and isinstance(e.get("rel"), str):
                    yield e
    except FileNotFoundError:
        pass


def _load_journal(dest: str) -> dict[str, dict]:
    """Finished files recorded by an unfinished run: rel -> entry."""
    out: dict[str, dict] = {}
    for e in _journal_lines(dest):
        if "range" not in e and "hash" in e:
            e.setdefault("algo", LEGACY_ALGO)
            out[e["rel"]] = e
    return out


def _load_ranges(dest: str) -> dict[str, list[dict]]:
    """Ranges of unfinished files an interrupted run wrote into their NAME.partial: rel -> records
    ({range, digest, size, mtime_ns, algo}); a file finished later drops its ranges."""
    out: dict[str, list[dict]] = {}
    for e in _journal_lines(dest):
        if "range" in e:
            out.setdefault(e["rel"], []).append(e)
        else:
            out.pop(e["rel"], None)
    return out


def _resumable(dest: str, todo: dict, src_files: dict[str, dict], algo: str) -> dict[str, list[dict]]:
    """The journaled ranges that can be resumed: the partial is still there and the source file has
    the size and mtime it had then, and this run hashes with the same algorithm."""
    out = {}
    for rel, recs in _load_ranges(dest).items():
        s = src_files.get(rel)
        if rel not in todo or s is None or not os.path.isfile(temp_path(os.path.join(dest, rel))):
            continue
        good = []
        for r in recs:
            try:
                ok = (r["size"], r["mtime_ns"], r["algo"]) == (s["size"], s["mtime_ns"], algo)
                ok = ok and 0 <= int(r["range"]) < _nchunks(s["size"]) and bytes.fromhex(r["digest"])
            except (KeyError, TypeError, ValueError):
                ok = False
            if ok:
                good.append(r)
        if good:
            out[rel] = good
    return out


def _bad_ranges(parts: list[bytes], ranges, size: int) -> str:
    """ ": bytes A-B[, ...]" for the 64 MiB ranges whose digest differs from the recorded one."""
    if not isinstance(ranges, list) or len(ranges) != len(parts):
        return ""
    bad = [i for i, (p, r) in enumerate(zip(parts, ranges)) if p.hex() != r]
    spans = ", ".join(f"{i * CHUNK}-{min(size, (i + 1) * CHUNK) - 1}" for i in bad[:3])
    return f": bytes {spans}{' ...' if len(bad) > 3 else ''}" if bad else ""


def _dest_files(dest: str) -> set[str]:
    out = set()
    for dirpath, dirs, names in os.walk(dest):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if not n.startswith("."):
                out.add(os.path.relpath(os.path.join(dirpath, n), dest))
    return out


def assess(
    src_files: dict[str, dict], dest: str, *, verify: bool = False, workers: int | None = None
) -> dict:
    """Compare the destination with the source: what is staged, what must be (re)copied and why."""
    manifest = _load_json(os.path.join(dest, MANIFEST))
    if manifest is not None and manifest.get("schema") != SCHEMA:
        manifest = None
    legacy = (manifest or {}).get("hash") or LEGACY_ALGO
    known: dict[str, dict] = {r: {"algo": legacy, **e} for r, e in (manifest or {}).get("files", {}).items()}
    known.update(_load_journal(dest))
    todo: dict[str, str] = {}
    keep: list[str] = []
    modes: dict[str, int] = {}  # kept files whose permissions differ from the source's
    for rel, s in src_files.items():
        e = known.get(rel)
        try:
            dst = os.stat(os.path.join(dest, rel))
        except (FileNotFoundError, NotADirectoryError):
            dst = None
        if e is None:
            todo[rel] = "not staged"
        elif e.get("size") != s["size"] or e.get("mtime_ns") != s["mtime_ns"]:
            todo[rel] = "changed in the source"
        elif dst is None:
            todo[rel] = "missing in the destination"
        elif dst.st_size != e["size"]:
            todo[rel] = f"size {dst.st_size} in the destination, {e['size']} staged"
        elif dst.st_mtime_ns != e["mtime_ns"]:
            todo[rel] = "modified in the destination"
        else:
            keep.append(rel)
            if "mode" in s and stat.S_IMODE(dst.st_mode) != s["mode"]:
                modes[rel] = stat.S_IMODE(dst.st_mode)
    verified, mismatched = 0, []
    if verify and keep:
        # each file with the algorithm it was staged with (a sha256 manifest stays verifiable)
        by_algo: dict[str, list[str]] = {}
        for rel in keep:
            by_algo.setdefault(known[rel]["algo"], []).append(rel)
        for algo, rels in sorted(by_algo.items()):
            if algo not in _CHUNK_HASH:
                for rel in rels:
                    todo[rel] = f"staged with hash {algo!r}, which this copier cannot compute here"
                continue
            parts = chunk_digests(dest, {r: src_files[r]["size"] for r in rels}, algo=algo, workers=workers)
            for rel in rels:
                if _tree(parts[rel]) != known[rel].get("hash"):
                    todo[rel] = "hash mismatch (corrupted in the destination)" + _bad_ranges(
                        parts[rel], known[rel].get("ranges"), src_files[rel]["size"]
                    )
                    mismatched.append(rel)
                else:
                    verified += 1
        keep = [r for r in keep if r not in todo]
    present = _dest_files(dest) if os.path.isdir(dest) else set()
    stale = sorted(r for r in present - set(src_files) if r in known)  # ours, gone from the source
    extra = sorted(r for r in present - set(src_files) - set(known) if not r.endswith(PARTIAL))
    fp = fingerprint(src_files)
    src_changed = bool(manifest) and manifest.get("source", {}).get("fingerprint") != fp
    return {
        "manifest": manifest is not None,
        "todo": todo,
        "keep": keep,
        "stale": stale,
        "extra": extra,
        "verified": verified,
        "mismatched": sorted(mismatched),
        "hashes": sorted({known[r]["algo"] for r in keep}),
        "modes": {r: m for r, m in modes.items() if r in keep},
        "source_changed": src_changed,
        "fingerprint": fp,
        "known": known,
    }


# -- hashing and copying ---------------------------------------------------------------------
class _Crc32:
    """zlib.crc32 with hashlib's update/digest (zlib releases the GIL for buffers > 5 KiB)."""

    __slots__ = ("crc",)

    def __init__(self):
        self.crc = 0

    def update(self, data) -> None:
        self.crc = zlib.crc32(data, self.crc)

    def digest(self) -> bytes:
        return self.crc.to_bytes(4, "big")


_CHUNK_HASH = {HASHES["crc32"]: _Crc32, HASHES["sha256"]: hashlib.sha256}
if xxhash is not None:  # XXH3 64-bit; digest() is the canonical 8 bytes, big-endian
    _CHUNK_HASH[HASHES["xxh3"]] = xxhash.xxh3_64


def algorithm(name: str | None) -> str:
    """The algorithm for a --hash NAME (xxh3, crc32, sha256; or the full name); None: the default."""
    if name is None:
        return HASH_ALGO
    algo = HASHES.get(name, name)
    if algo in _CHUNK_HASH:
        return algo
    if algo in HASHES.values():
        raise StageError(
            f"hash {name!r} needs the Python package xxhash, which is not installed here",
            "pip install xxhash, or use --hash crc32",
        )
    raise StageError(f"unknown hash {name!r}", f"use one of: {', '.join(HASHES)}")


def temp_path(path: str) -> str:
    """Where a file is written before it is renamed into place (one name for every temp file here)."""
    return path + PARTIAL


_tls = threading.local()


def _buf() -> memoryview:
    """This thread's read buffer: anonymous memory, page-aligned as O_DIRECT reads require (an
    anonymous mapping maps no file, so nothing about it can SIGBUS). DIRECT_BLOCK bytes: a cold
    read fills all of it, a buffered one BUF."""
    b = getattr(_tls, "buf", None)
    if b is None:
        b = _tls.buf = memoryview(mmap.mmap(-1, DIRECT_BLOCK))
    return b


# -- reading a cold source ---------------------------------------------------------------------
# After a reboot the source is not in the page cache. Two ways to read it, and which is faster
# depends on the box (measured, docs/stage.md: on a 16-core VM `xargs -P16 cp`'s buffered reads
# reached 1.66 GB/s and one O_DIRECT stream per file 1.47; on a 32-core one 2.28 and 2.23; on the
# 2-core VM O_DIRECT took half the CPU of buffered reads), so a short probe decides (Copier._probe):
# - O_DIRECT: the device writes into our buffer, no page-cache insertion (allocation, LRU, later
#   reclaim; the pages would also be charged to the container's memory cgroup next to the tmpfs
#   copy). DIRECT_BLOCK per read, COLD_THREADS threads: enough requests in flight.
# - buffered: the kernel's readahead along each worker's span (one fd per span, so its window
#   carries over from range to range; POSIX_FADV_SEQUENTIAL doubles it), PREFETCH more if set.
# Chunks whose pages ARE cached are read buffered (O_DIRECT would go to the device for data already
# in memory). Residency comes from cachestat(2) (Linux 6.5+; it reads the page cache's counters,
# starts no I/O and maps nothing); where it is missing, or the filesystem is not a local block
# filesystem, reads stay buffered.
DIRECT_FS = {"ext4", "xfs", "btrfs", "f2fs", "ext3", "ext2"}
_NR_CACHESTAT = 451  # the same number on x86_64 and the asm-generic table (arm64)
_cachestat_fn: list = []


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


def _direct_fd(path: str, ident: tuple[int, int]) -> int | None:
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


def _shrank(off: int) -> StageError:
    return StageError(f"source shrank while reading (at byte {off})", "re-run when the source is stable")


class _NoRoom(Exception):
    """The destination's filesystem (or quota) is full: Copier turns it into a StageError naming DEST."""


def _write(dfd: int, view, off: int) -> None:
    w = 0
    try:
        while w < len(view):
            w += os.pwrite(dfd, view[w:] if w else view, off + w)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _NoRoom(exc.strerror) from None
        raise


def _prefetch(fd: int, off: int, n: int) -> None:
    if n > 0 and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)


def _copy_span(
    h,
    sfd: int,
    dfd: int | None,
    start: int,
    end: int,
    extra=None,
    advance=None,
    block: int = BUF,
    prefetch: int = 0,
    wlock=_NO_LOCK,
) -> None:
    """Read [start, end) of sfd once, `block` bytes a read: write each BUF slice to dfd at the same
    offset and feed it to the hash `h` (and `extra`) while it is in the CPU cache. Plain reads cannot
    SIGBUS when the source shrinks (a read of a mapping past a new EOF does): a short read is an error.
    `prefetch`: keep that much ahead of the reads asked of the kernel (POSIX_FADV_WILLNEED).
    `wlock`: the destination file's write lock (_FileJob.wlock), held around each pwrite."""
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
        for p in range(0, n, BUF):
            view = buf[p : min(n, p + BUF)]
            if dfd is not None:
                with wlock:
                    _write(dfd, view, off + p)
            h.update(view)
            if extra is not None:
                extra.update(view)
        off += n
        pending += n
        if advance and pending >= 32 * BUF:
            advance(pending)
            pending = 0
    if advance and pending:
        advance(pending)


def _chunk(
    sfd: int,
    dfd: int | None,
    start: int,
    end: int,
    algo: str = HASH_ALGO,
    extra=None,
    advance=None,
    block: int = BUF,
    prefetch: int = 0,
    h=None,
    wlock=_NO_LOCK,
) -> bytes:
    """The `algo` digest of [start, end) of sfd, copied to dfd on the way (_copy_span). `h`: a hash
    that already holds the range's first bytes (the cold probe copied them), continued from start."""
    if h is None:
        h = _CHUNK_HASH[algo]()
    _copy_span(h, sfd, dfd, start, end, extra, advance, block, prefetch, wlock)
    return h.digest()


def _nchunks(size: int) -> int:
    return max(1, -(-size // CHUNK))


def _tree(digests: list[bytes]) -> str:
    return hashlib.sha256(b"".join(digests)).hexdigest()


def cpu_count() -> int:
    """CPUs this process may run on (taskset/cpuset), not the machine's: os.cpu_count() counts all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def default_workers() -> int:
    """Copy threads: the CPUs this process may use, 2..16 (GPUBOX_STAGE_WORKERS sets it: the
    benchmark's variants time other counts with the same engine)."""
    try:
        return max(1, int(os.environ["GPUBOX_STAGE_WORKERS"]))
    except (KeyError, ValueError):
        return max(2, min(16, cpu_count()))


def _run_tasks(tasks, workers: int, abort=None) -> None:
    """Run callables on a thread pool; the first failure (or an interrupt) cancels what has not
    started, tells the running ones to stop (`abort()`), waits for them, and is raised."""
    ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stage")
    try:
        futs = [ex.submit(t) for t in tasks]
        wait(futs, return_when=FIRST_EXCEPTION)
    finally:
        if abort is not None:
            abort()
        ex.shutdown(wait=True, cancel_futures=True)
    for f in futs:
        if f.done() and not f.cancelled() and f.exception() is not None:
            raise f.exception()


def _open_src(path: str, ident: tuple[int, int] | None = None) -> int:
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


def chunk_digests(
    root: str, sizes: dict[str, int], *, algo: str = HASH_ALGO, workers: int | None = None, advance=None
) -> dict[str, list[bytes]]:
    """`algo` digest of every 64 MiB range of each file (rel -> [digest per range]), in parallel."""
    parts: dict[str, list] = {r: [None] * _nchunks(s) for r, s in sizes.items()}

    def task(rel, i):
        def run():
            fd = _open_src(os.path.join(root, rel))
            try:
                parts[rel][i] = _chunk(
                    fd, None, i * CHUNK, min(sizes[rel], (i + 1) * CHUNK), algo, advance=advance
                )
            except StageError as exc:
                raise StageError(
                    f"{os.path.join(root, rel)} shrank while it was hashed ({exc.problem})",
                    "re-run when nothing else writes to it",
                ) from None
            finally:
                os.close(fd)

        return run

    order = sorted(sizes, key=lambda r: -sizes[r])
    _run_tasks([task(r, i) for r in order for i in range(_nchunks(sizes[r]))], workers or default_workers())
    return parts


def hash_files(
    root: str, sizes: dict[str, int], *, algo: str = HASH_ALGO, workers: int | None = None, advance=None
) -> dict[str, str]:
    """`algo` digest of each file (rel -> hex): sha256 over its range digests."""
    parts = chunk_digests(root, sizes, algo=algo, workers=workers, advance=advance)
    return {r: _tree(p) for r, p in parts.items()}


class _FileJob:
    """One file being copied: the destination fd and a witness source fd opened by the first chunk,
    finished by the last (_Schedule hands out its ranges).
    `resume`: range -> digest journaled by an interrupted run whose NAME.partial is still there;
    those ranges are re-hashed in the partial and copied again only where they differ."""

    def __init__(self, src: str, dest: str, rel: str, info: dict, resume: dict[int, bytes] | None = None):
        self.rel, self.info = rel, info
        self.spath, self.dpath = os.path.join(src, rel), os.path.join(dest, rel)
        self.partial = temp_path(self.dpath)
        self.n = _nchunks(info["size"])
        self.whole = bool(info.get("hub_sha256"))  # one sequential pass (the hub's whole-file sha256)
        self.resume = {} if self.whole else dict(resume or {})
        self.digests: list = [None] * self.n
        # range -> (hash, bytes): the cold probe copied the range's first bytes (Copier._probe)
        self.heads: dict[int, tuple] = {}
        self.left = self.n
        self.lock = threading.Lock()
        # held around each pwrite into the partial (WRITE_LOCK): writers of one file wait here
        # asleep instead of spinning on the tmpfs inode lock (see _Schedule)
        self.wlock = threading.Lock() if WRITE_LOCK else _NO_LOCK
        self.sfd = self.dfd = None
        self.ident: tuple[int, int] | None = None
        self.finished = False

    def open(self) -> None:
        with self.lock:
            if self.sfd is None:
                self.sfd = os.open(self.spath, os.O_RDONLY)
                st = os.fstat(self.sfd)
                self.ident = (st.st_dev, st.st_ino)
                # 0600 until complete; _finish gives it the source's mode (never wider on the way).
                # A partial with journaled ranges is kept (resume); any other starts empty.
                flags = os.O_WRONLY | os.O_CREAT | (0 if self.resume else os.O_TRUNC)
                self.dfd = os.open(self.partial, flags, 0o600)

    def close(self) -> None:
        for fd in (self.sfd, self.dfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.sfd = self.dfd = None


class _Span:
    """One worker's share of a file: ranges [next, stop), copied in order, so the worker's reads of
    it are one sequential stream on one fd (_Streams) and the kernel's readahead window carries
    over from range to range."""

    __slots__ = ("job", "next", "stop")

    def __init__(self, job: _FileJob, nxt: int, stop: int):
        self.job, self.next, self.stop = job, nxt, stop


class _Schedule:
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
    16-core device VM where the engine's alternating ranges reached 1.60; docs/stage.md, run I).
    Files finish roughly in order (largest first), and the journal records each finished range, so
    an interrupted run resumes."""

    def __init__(self, jobs: list[_FileJob]):
        self.fresh = [j for j in jobs if j.whole] + [j for j in jobs if not j.whole]
        self.spans: list[_Span] = []
        self.lock = threading.Lock()
        self.stop = False

    def take(self, span: _Span | None) -> tuple[_Span, int | None] | None:
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
                    return _Span(job, job.n, job.n), None
                span = _Span(job, 1, job.n)
                self.spans.append(span)
                return span, 0
            self.spans = [s for s in self.spans if s.next < s.stop]
            if not self.spans:
                return None
            victim = max(self.spans, key=lambda s: s.stop - s.next)
            mid = victim.stop - max(1, (victim.stop - victim.next) // 2)
            span = _Span(victim.job, mid + 1, victim.stop)
            victim.stop = mid
            self.spans.append(span)
            return span, mid


class _Streams:
    """A worker's open source fds for the file it copies, one per read path ("direct", "buffered"):
    kept from range to range of that file (the readahead state lives in the open file), closed
    when the worker moves to another file or stops."""

    def __init__(self):
        self.job: _FileJob | None = None
        self.fds: dict[str, int] = {}

    def get(self, job: _FileJob, kind: str, opener) -> int | None:
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


def _read_mode_setting() -> str:
    """GPUBOX_STAGE_DIRECT: auto (probe, the default) | 1 (O_DIRECT for uncached ranges) | 0 (buffered)."""
    v = os.environ.get("GPUBOX_STAGE_DIRECT", "auto").strip().lower()
    return {"1": "direct", "0": "buffered"}.get(v, "auto")


PROBE_BYTES = 8 << 20  # per thread and phase: the first bytes of a range, copied by the probe
# O_DIRECT is taken only when the probe finds it this much faster: its short reads understate what
# buffered reads reach over a whole run (the kernel's readahead grows along a stream). Measured on
# the 16-core device VM, 10 GB cold: probe buffered 1.14-1.26 GB/s, whole runs 1.45-1.63; probe
# O_DIRECT (16 x 4 MiB) 1.04-1.21, whole run 1.25; the probe once put O_DIRECT 6% ahead.
DIRECT_MARGIN = 1.15
PROBE_PHASES = ("direct", "buffered", "buffered", "direct")  # a drift of the device hits both alike


# copy threads per file for a cached source (Copier._cached_threads)
WRITERS_PER_FILE = max(1.0, float(os.environ.get("GPUBOX_STAGE_WRITERS_PER_FILE") or 1.5))
# how long a filesystem's read verdict is kept before the next cold run probes again
VERDICT_DAYS = float(os.environ.get("GPUBOX_STAGE_VERDICT_DAYS") or 7)
VERDICTS = "read-verdicts.json"


def _state_dir() -> str | None:
    """Where the read verdicts are kept: on persistent storage, never the tmpfs destination (a
    reboot empties it, and the reboot is when the verdict is wanted). GPUBOX_STAGE_STATE_DIR, else
    $XDG_STATE_HOME/gpubox or ~/.local/state/gpubox; GPUBOX_STAGE_STATE_DIR="" keeps none (every
    cold run probes)."""
    d = os.environ.get("GPUBOX_STAGE_STATE_DIR")
    if d is not None:
        return d or None
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpubox")


def _fs_key(path: str, threads: int) -> str | None:
    """Which filesystem the source is on, and at what depth it was read: st_dev and the
    filesystem id (statfs f_fsid: ext4 and xfs derive it from the filesystem's UUID, so a disk
    that comes back under another device number, or another filesystem on the same number, is
    not mistaken for the one probed) and the thread count."""
    try:
        st, vfs = os.stat(path), os.statvfs(path)
    except OSError:
        return None
    return f"dev={st.st_dev:x} fsid={getattr(vfs, 'f_fsid', 0):x} threads={threads}"


def _remembered(src: str, threads: int) -> dict | None:
    """The verdict of an earlier probe on this filesystem at this depth, younger than VERDICT_DAYS,
    or None (then the copy probes). Why keep it: the probe costs the copy the phases it spends
    with the slower path and waiting for each phase's slowest reader (~0.5 s of an 8 GB cold run
    on the 16-core device VM, docs/stage.md), and a box's disk does not change between reboots;
    when it does (another disk, another filesystem) the key differs, and an old verdict expires."""
    d, key = _state_dir(), _fs_key(src, threads)
    if d is None or key is None:
        return None
    doc = _load_json(os.path.join(d, VERDICTS))
    e = doc.get(key) if isinstance(doc, dict) else None
    try:
        fresh = -300 <= time.time() - float(e["at"]) < VERDICT_DAYS * 86400  # (a clock set back a little)
        ok = e["mode"] in ("direct", "buffered") and isinstance(e["probe_gb_s"], dict)
    except (TypeError, KeyError, ValueError):
        return None
    return e if fresh and ok else None


def _remember(src: str, threads: int, mode: str, rates: dict) -> None:
    """Keep this probe's verdict for the next cold run on this filesystem (atomic replace; where
    the state directory cannot be written nothing is kept and every cold run probes)."""
    d, key = _state_dir(), _fs_key(src, threads)
    if d is None or key is None:
        return
    path = os.path.join(d, VERDICTS)
    try:
        os.makedirs(d, exist_ok=True)
        _drop_dead_temps(d)
        doc = _load_json(path)
        doc = doc if isinstance(doc, dict) else {}
        doc[key] = {"mode": mode, "probe_gb_s": rates, "at": int(time.time())}
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def _drop_dead_temps(d: str) -> None:
    """Remove the VERDICTS.<pid>.tmp a killed run left in D (its pid no longer runs): the name is
    this process's own, so no later run would ever replace it. (stage.py also runs as a plain
    script, without gpubox.safeio, whose clean_stale does this for gpubox's other files.)"""
    for name in os.listdir(d):
        pid = name[len(VERDICTS) + 1 : -len(".tmp")]
        if not (name.startswith(VERDICTS + ".") and name.endswith(".tmp") and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(d, name))
            except FileNotFoundError:
                pass
        except OSError:
            pass  # alive (EPERM: another user's): not ours to remove


class Copier:
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
        self.journal = open(os.path.join(dest, JOURNAL), "a")
        self.done: dict[str, dict] = {}
        self.setting = _read_mode_setting()
        self.direct = hasattr(os, "O_DIRECT") and _fstype(src) in DIRECT_FS and self.setting != "buffered"
        self.direct_bytes = 0  # read with O_DIRECT (the summary's read_direct_bytes)
        self.resumed_bytes = 0  # kept from an interrupted run's partials (re-hashed, not re-read)
        # "cached": the source is in the page cache (read buffered); "direct"/"buffered": how an
        # uncached range is read, from the probe or GPUBOX_STAGE_DIRECT
        self.read = {"mode": "cached", "threads": workers}

    def _cold_share(self, jobs: list[_FileJob]) -> tuple[float, list]:
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
                c = cached_bytes(fd, 0, size)
                if c is None:
                    return 0.0, []
                total += size
                uncached += max(0, size - c)
                if j.whole:
                    continue
                for i in range(j.n):
                    lo = i * CHUNK
                    if i in j.resume or lo + PROBE_BYTES > size:
                        continue
                    # a shard's first range holds its header, which the integrity check just read
                    # (a few pages, and the readahead after them): still a cold range to time
                    if (cached_bytes(fd, lo, PROBE_BYTES) or 0) <= PROBE_BYTES // 16:
                        ranges.append((j, i))
            finally:
                os.close(fd)
        return (uncached / total if total else 0.0), ranges

    def _choose_read(self, jobs: list[_FileJob]) -> int:
        """How to read this run's source, and with how many threads (returned)."""
        cold, ranges = self._cold_share(jobs)
        if cold < 0.5:
            self.read["threads"] = self._cached_threads(jobs)
            return self.read["threads"]
        threads = max(self.workers, COLD_THREADS)
        mode = self.setting if self.direct else "buffered"  # O_DIRECT: local block filesystems only
        self.read = {"mode": mode, "threads": threads, "cold_share": round(cold, 3)}
        if mode == "auto":
            big = len(ranges) >= 4 * threads  # enough uncached ranges for four phases at full depth
            known = _remembered(self.src, threads) if big else None
            if known is not None:  # this filesystem's verdict from an earlier cold run (_remember)
                self.read.update(mode=known["mode"], probe_gb_s=known["probe_gb_s"], probed_at=known["at"])
            elif big:
                step = len(ranges) / (4 * threads)
                pick = [ranges[int(k * step)] for k in range(4 * threads)]
                rates = self._probe(pick, threads)
                self.read["probe_gb_s"] = {k: round(v, 3) for k, v in rates.items()}
                faster = rates["direct"] > DIRECT_MARGIN * rates["buffered"]
                self.read["mode"] = "direct" if faster else "buffered"
                if min(rates.values()) > 0:  # both paths worked: a verdict worth keeping
                    _remember(self.src, threads, self.read["mode"], self.read["probe_gb_s"])
            else:  # too little to measure: read as cp does. Buffered won every measurement so
                # far: all probes on the 16-core device VM, and 2 GB on a 2-core VM (0.94x `cp -r`
                # against 1.17x with O_DIRECT, docs/stage.md); the page cache it fills is small
                self.read["mode"] = "buffered"
        if self.read["mode"] == "buffered":
            self.direct = False
        return threads

    def _cached_threads(self, jobs: list[_FileJob]) -> int:
        """Copy threads for a source in the page cache: 1.5 per file of more than one range
        (WRITERS_PER_FILE), at most `workers`, at least 2; threads whose file is done join the
        others' (_Schedule), so the last shard is still split. Why not one per range: tmpfs holds
        the inode lock for each write to a file, and a second writer spins on it; why more than one
        per file: the reads and checksums of a second writer overlap the first one's writes.
        Measured on the 16-core device VM, 8 GB in 8 shards, warm, 5 rounds (docs/stage.md, run H):
        8 threads 0.93 s / 6.2 CPU-s, 12 threads 0.80 s / 7.4 CPU-s, 16 threads 0.79 s / 9.3 CPU-s
        (`xargs -P16 cp` 0.81 s / 4.7, `cp -r` 4.3 CPU-s)."""
        multi = sum(1 for j in jobs if j.n > 1 or j.whole)
        return min(self.workers, max(2, math.ceil(WRITERS_PER_FILE * multi)))

    def _probe(self, pick: list[tuple[_FileJob, int]], threads: int) -> dict:
        """Time the two cold read paths on this box: `threads` readers at once, each copying the
        first PROBE_BYTES of one uncached range, O_DIRECT in DIRECT_BLOCK reads or buffered (with
        PREFETCH ahead where set), in four phases (PROBE_PHASES). What the probe reads is the copy's own
        first bytes of those ranges: written into the partial and hashed, the hash kept on the job
        (job.heads), so the copy goes on from there and no byte is read twice (the probe that read
        pieces apart from the copy cost ~8% of an 8 GB cold run on the device VM, docs/stage.md).
        A piece that failed (O_DIRECT refused) keeps no head: its range is copied whole later.
        Returns {"direct": GB/s, "buffered": GB/s} (a mode that failed: 0)."""
        q = len(pick) // len(PROBE_PHASES)
        spent = {"direct": 0.0, "buffered": 0.0}
        moved = dict.fromkeys(spent, 0)
        failed: set = set()
        for k, mode in enumerate(PROBE_PHASES):

            def head(job: _FileJob, i: int, mode=mode) -> None:
                job.open()
                start = i * CHUNK
                fd = _direct_fd(job.spath, job.ident) if mode == "direct" else _open_src(job.spath, job.ident)
                if fd is None:
                    failed.add(mode)
                    return
                h = _CHUNK_HASH[self.algo]()
                # buffered: the whole piece asked of the kernel at once (POSIX_FADV_WILLNEED), as
                # a stream's readahead has it in flight once it has grown; without that an 8 MiB
                # piece from a fresh fd times the readahead's ramp (16-core device VM, 16 GB:
                # 0.51 GB/s buffered against 1.23 O_DIRECT, and the copy then read O_DIRECT at
                # 1.29 GB/s where buffered reached 1.71; docs/stage.md run L)
                how = {"block": DIRECT_BLOCK} if mode == "direct" else {"prefetch": PROBE_BYTES}
                try:
                    _copy_span(
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
            _run_tasks([lambda a=a: head(*a) for a in pick[k * q : (k + 1) * q]], threads)
            spent[mode] += time.perf_counter() - t0
            moved[mode] += q * PROBE_BYTES
        return {m: 0.0 if m in failed or spent[m] <= 0 else moved[m] / spent[m] / GB for m in spent}

    def run(self) -> dict[str, dict]:
        jobs = [
            _FileJob(self.src, self.dest, r, self.files[r], self.resume.get(r))
            for r in sorted(self.files, key=lambda r: -self.files[r]["size"])
        ]
        for j in jobs:
            os.makedirs(os.path.dirname(j.dpath), exist_ok=True)
        sched = _Schedule(jobs)
        try:
            threads = self._choose_read(jobs)  # a cold probe copies into the partials: inside the try
            _run_tasks(
                [self._worker(sched) for _ in range(min(threads, sum(j.n for j in jobs)) or 1)],
                threads,
                abort=lambda: setattr(sched, "stop", True),
            )
        except _NoRoom as exc:
            raise self._full(exc) from None
        except OSError as exc:  # the journal, a directory: the same full filesystem
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._full(_NoRoom(exc.strerror)) from None
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

    def _full(self, exc: _NoRoom) -> StageError:
        free = statvfs_free(self.dest)
        return StageError(
            f"destination {self.dest} is full ({exc}; {_gb(free)} free on its filesystem); "
            f"the unfinished files were removed, {len(self.done)} finished file(s) kept",
            "free space on the destination (or raise the tmpfs size), then re-run to resume",
        )

    def _worker(self, sched: _Schedule):
        def run():
            span, streams = None, _Streams()
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

    def _reader(self, job: _FileJob, start: int, end: int, streams: _Streams) -> tuple[int, dict]:
        """An fd to read [start, end) of the source (the worker's own, kept along its span) and how
        (_chunk's block/prefetch): O_DIRECT, or buffered with prefetch, when most of it is not
        cached (by the probe's choice), else buffered."""

        def buffered() -> int:
            return _open_src(job.spath, job.ident)

        if self.read["mode"] != "cached" and job.info["size"] >= BUF:  # small files: not worth a 2nd open
            cached = cached_bytes(job.sfd, start, end - start)
            if cached is not None and cached < (end - start) // 2:
                if self.direct:
                    fd = streams.get(job, "direct", lambda: _direct_fd(job.spath, job.ident))
                    if fd is not None:
                        with self.jlock:
                            self.direct_bytes += end - start
                        return fd, {"block": DIRECT_BLOCK}
                    self.direct = False  # refused here: the rest is read buffered
                return streams.get(job, "buffered", buffered), {"prefetch": PREFETCH}
        return streams.get(job, "buffered", buffered), {}

    def _kept(self, job: _FileJob, i: int, start: int, end: int) -> bool:
        """Range i of an interrupted run's partial, re-hashed: True when it holds what was journaled."""
        fd = os.open(job.partial, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < end:
                return False
            ok = _chunk(fd, None, start, end, self.algo) == job.resume[i]
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

    def _copy(self, job: _FileJob, i: int | None, streams: _Streams) -> None:
        job.open()
        if i is None:  # whole file, sequentially, with the hub's sha256 alongside
            whole = hashlib.sha256()
            for k in range(job.n):
                start, end = k * CHUNK, min(job.info["size"], (k + 1) * CHUNK)
                fd, how = self._reader(job, start, end, streams)
                job.digests[k] = _chunk(
                    fd,
                    job.dfd,
                    start,
                    end,
                    self.algo,
                    extra=whole,
                    advance=self.advance,
                    wlock=job.wlock,
                    **how,
                )
            self._finish(job, whole.hexdigest())
            return
        start, end = i * CHUNK, min(job.info["size"], (i + 1) * CHUNK)
        if i in job.resume and self._kept(job, i, start, end):
            job.digests[i] = job.resume[i]
        else:
            h, done = job.heads.pop(i, (None, 0))  # the probe's first bytes of this range
            fd, how = self._reader(job, start + done, end, streams)
            try:
                job.digests[i] = _chunk(
                    fd,
                    job.dfd,
                    start + done,
                    end,
                    self.algo,
                    advance=self.advance,
                    h=h,
                    wlock=job.wlock,
                    **how,
                )
            except OSError as exc:
                if exc.errno != errno.EINVAL or "block" not in how:
                    raise
                self.direct = False  # O_DIRECT refused at read time: this chunk again, buffered
                streams.drop("direct")
                fd, _ = self._reader(job, start, end, streams)
                job.digests[i] = _chunk(fd, job.dfd, start, end, self.algo, wlock=job.wlock)
            if job.n > 1:
                self._journal_range(job, i)
        with job.lock:
            job.left -= 1
            last = job.left == 0
        if last:
            self._finish(job, None)

    def _journal_range(self, job: _FileJob, i: int) -> None:
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

    def _finish(self, job: _FileJob, sha: str | None) -> None:
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
            "hash": _tree(job.digests),
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


# -- room ------------------------------------------------------------------------------------
def _fstype(path: str) -> str | None:
    """Filesystem type of the mount holding path, from /proc/self/mounts (read only)."""
    real = os.path.realpath(path)
    best, typ = "", None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mp = parts[1].replace("\\040", " ")
                if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                    best, typ = mp, parts[2]
    except OSError:
        return None
    return typ


def _existing(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    return path


def statvfs_free(path: str) -> int:
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def cgroup_memory(cgroup_dir: str) -> tuple[int, int] | None:
    """(memory.max, memory.current) of a cgroup v2 dir, or None when unlimited/unknown."""
    try:
        with open(os.path.join(cgroup_dir, "memory.max")) as f:
            mx = f.read().strip()
        with open(os.path.join(cgroup_dir, "memory.current")) as f:
            cur = int(f.read().strip())
    except (OSError, ValueError):
        return None
    if mx == "max":
        return None
    try:
        return int(mx), cur
    except ValueError:
        return None


def check_room(
    dest: str,
    need: int,
    *,
    tmpfs: bool,
    cgroup_dir: str | None,
    free_space=None,
    margin: int = FS_MARGIN,
    mem_margin: int = MEM_MARGIN,
) -> dict:
    """Figures for `need` more bytes in dest; raises StageError when they do not fit with the margins.

    tmpfs pages are charged to the memory cgroup of the writer (shmem), so inside an LXC container a
    52 GB model in a 64 GB container leaves 12 GB for the server and everything else."""
    free = (free_space or statvfs_free)(dest)
    fig = {"need": need, "free": free, "margin": margin}
    problems = []
    if need + margin > free:
        problems.append(
            f"{dest} needs {_gb(need)} but its filesystem has {_gb(free)} free "
            f"(keeping a {_gb(margin)} margin)"
        )
    mem = cgroup_memory(cgroup_dir) if (tmpfs and cgroup_dir) else None
    if mem:
        limit, used = mem
        fig.update(mem_limit=limit, mem_used=used, mem_margin=mem_margin)
        if need + mem_margin > limit - used:
            problems.append(
                f"tmpfs pages count against the container's memory: limit {_gb(limit)}, "
                f"{_gb(used)} in use, {_gb(limit - used)} left; staging {_gb(need)} would leave "
                f"{_gb(limit - used - need)} (< {_gb(mem_margin)} margin)"
            )
    if problems:
        raise StageError(
            "; ".join(problems),
            "free space or raise the container's memory (pct set VMID --memory MiB), "
            "or pass --force to stage anyway",
        )
    return fig


# -- lock ------------------------------------------------------------------------------------
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


# -- the two operations ----------------------------------------------------------------------
def _write_atomic(path: str, data: bytes, sync: bool) -> None:
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StageError(
                f"destination {os.path.dirname(path)} is full (writing "
                f"{os.path.basename(path)}: {exc.strerror})",
                "free space on the destination, then re-run to resume",
            ) from None
        raise
    os.replace(tmp, path)


def check(
    src: str,
    dest: str,
    *,
    verify: bool = False,
    require_tokenizer: bool = True,
    workers: int | None = None,
    follow_links: bool = False,
) -> dict:
    """Is dest a complete, current copy of src? Reads only (stat, headers; hashes with verify)."""
    t0 = time.monotonic()
    files = scan(src, follow_links=follow_links)
    a = assess(files, dest, verify=verify, workers=workers)
    problems = []
    if not a["manifest"]:
        problems.append(
            "manifest absent: not staged"
            if not a["known"]
            else f"manifest absent: staging was interrupted ({len(a['known'])} of {len(files)} files done)"
        )
    elif a["source_changed"]:
        problems.append("the source changed since it was staged")
    for rel, why in sorted(a["todo"].items()):
        if a["manifest"] or why != "not staged":
            problems.append(f"{rel}: {why}")
    if a["stale"]:
        problems.append(f"{len(a['stale'])} staged file(s) no longer in the source, e.g. {a['stale'][0]}")
    for rel, mode in sorted(a["modes"].items()):
        problems.append(f"{rel}: mode {mode:04o} in the destination, {files[rel]['mode']:04o} in the source")
    if os.path.isdir(dest):
        present = {r: None for r in _dest_files(dest)}
        if a["manifest"] or present:
            problems += [f"integrity: {p}" for p in stc.check_model(dest, present, require_tokenizer)]
    return {
        "schema": SCHEMA,
        "op": "check",
        "src": src,
        "dest": dest,
        "staged": not problems,
        "problems": problems,
        "files": len(files),
        "bytes": sum(f["size"] for f in files.values()),
        "todo": len(a["todo"]),
        "todo_bytes": sum(files[r]["size"] for r in a["todo"]),
        "verified": a["verified"],
        "mismatched": a["mismatched"],
        "source_changed": a["source_changed"],
        "hashes": a["hashes"],
        "seconds": round(time.monotonic() - t0, 4),
    }


def stage(
    src: str,
    dest: str,
    *,
    verify: bool = False,
    force: bool = False,
    dry_run: bool = False,
    workers: int | None = None,
    require_tokenizer: bool = True,
    cgroup_dir: str | None = None,
    tmpfs: bool | None = None,
    free_space=None,
    margin: int = FS_MARGIN,
    mem_margin: int = MEM_MARGIN,
    progress=None,
    on_file=None,
    source_info: dict | None = None,
    hash: str | None = None,
    follow_links: bool = False,
) -> dict:
    """Make dest a verified copy of src. Returns the summary (bytes, seconds, GB/s, files copied,
    skipped, verified). `hash` (xxh3 | crc32 | sha256, default xxh3, crc32 without xxhash) hashes
    the files this run copies; files kept from an earlier run keep theirs. `progress` has
    start(total, description)/advance(n)/stop(); `on_file(rel)` is called after each file lands
    (tests use it to interrupt a run). Staged files get the source file's permission bits; links
    out of the source are refused unless follow_links (then listed in "links_out").

    The passes, in order (each its own function, saying why): _source (what to copy, and is it a
    model), _dry_run (or: what would happen, nothing changed), under the lock _plan (what the
    destination holds, what an interrupted run left to resume), _fix_modes, the room check
    (_room_needed, check_room), _unpublish (the directory stops looking staged), _copy_pass,
    _publish (the manifest, last)."""
    t0 = time.monotonic()
    algo = algorithm(hash)
    workers = workers or default_workers()
    src, dest = os.path.abspath(src), os.path.abspath(dest)
    files = _source(src, dest, follow_links=follow_links, require_tokenizer=require_tokenizer, force=force)
    if tmpfs is None:
        tmpfs = _fstype(_existing(dest)) == "tmpfs"
    summary = _new_summary(src, dest, files, algo, dry_run)
    room_kw = {
        "tmpfs": tmpfs,
        "cgroup_dir": cgroup_dir,
        "free_space": free_space,
        "margin": margin,
        "mem_margin": mem_margin,
    }
    if dry_run:
        return _finished(summary, t0, **_dry_run(files, dest, verify, workers, room_kw))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with Lock(dest):
        a, ranges = _plan(files, dest, verify=verify, workers=workers, algo=algo)
        summary.update(verified=a["verified"], reasons=a["todo"], source_changed=a["source_changed"])
        summary["modes_fixed"] = _fix_modes(dest, files, a["modes"])
        if a["manifest"] and not a["todo"] and not a["stale"] and not a["source_changed"]:
            return _finished(summary, t0, skipped=len(a["keep"]))
        need = _room_needed(files, dest, a["todo"], ranges)
        room = {} if force else check_room(dest, need, **room_kw)
        sync = not tmpfs  # fsync buys nothing on tmpfs (a reboot empties it anyway)
        kept = _unpublish(dest, a, ranges, sync)
        copier = _copy_pass(src, dest, files, a["todo"], ranges, need, workers, sync, algo, progress, on_file)
        summary.update(
            read_direct_bytes=copier.direct_bytes, resumed_bytes=copier.resumed_bytes, read=copier.read
        )
        _publish(
            src,
            dest,
            files,
            a["fingerprint"],
            {**kept, **copier.done},
            algo=algo,
            sync=sync,
            require_tokenizer=require_tokenizer,
            force=force,
            source_info=source_info,
        )
        return _finished(
            summary,
            t0,
            copied=len(copier.done),
            copied_bytes=sum(e["size"] for e in copier.done.values()),
            skipped=len(a["keep"]),
            removed=a["stale"],
            room=room,
        )


def _source(src: str, dest: str, *, follow_links: bool, require_tokenizer: bool, force: bool) -> dict:
    """The source's files (scan), refused before anything is written when it overlaps the
    destination (a copy into itself would never end) or is not a complete model (an incomplete
    copy would be staged and served; --force copies it as it is)."""
    if dest == src or dest.startswith(src.rstrip("/") + "/") or src.startswith(dest.rstrip("/") + "/"):
        raise StageError(f"source {src} and destination {dest} overlap", "stage into a separate directory")
    files = scan(src, follow_links=follow_links)
    src_problems = stc.check_model(src, files, require_tokenizer)
    if src_problems and not force:
        raise StageError(
            f"source {src} is not a complete model: {'; '.join(src_problems[:3])}",
            "repair the source (or pass --force to copy it as it is)",
        )
    return files


def _new_summary(src: str, dest: str, files: dict, algo: str, dry_run: bool) -> dict:
    """The summary every outcome returns, with its keys present from the start (a no-op run, a dry
    run and a copy answer in one shape for --json and the step's evidence)."""
    return {
        "schema": SCHEMA,
        "op": "stage",
        "src": src,
        "dest": dest,
        "dry_run": dry_run,
        "hash": algo,
        "files": len(files),
        "bytes": sum(f["size"] for f in files.values()),
        "copied": 0,
        "copied_bytes": 0,
        "skipped": 0,
        "verified": 0,
        "removed": [],
        "reasons": {},
        "source_changed": False,
        "modes_fixed": [],
        "read_direct_bytes": 0,
        "resumed_bytes": 0,
        "links_out": {r: e["link"] for r, e in sorted(files.items()) if "link" in e},
    }


def _finished(summary: dict, t0: float, **kw) -> dict:
    summary.update(kw)
    secs = time.monotonic() - t0
    summary["seconds"] = round(secs, 4)
    summary["gb_s"] = round(summary["copied_bytes"] / secs / GB, 3) if secs > 0 else 0.0
    return summary


def _dry_run(files: dict, dest: str, verify: bool, workers: int, room_kw: dict) -> dict:
    """What a run would do, without the lock and without writing: the files to copy and why, and
    whether the room check would refuse (reported, not raised: a dry run shows what apply meets)."""
    a = assess(files, dest, verify=verify, workers=workers)
    todo = a["todo"]
    need = sum(files[r]["size"] for r in todo)
    try:
        room, room_problem = check_room(dest, need, **room_kw), None
    except StageError as exc:
        room, room_problem = {}, exc.problem
    return {
        "would_copy": sorted(todo),
        "would_copy_bytes": need,
        "reasons": todo,
        "skipped": len(a["keep"]),
        "would_chmod": sorted(a["modes"]),
        "verified": a["verified"],
        "removed": a["stale"],
        "source_changed": a["source_changed"],
        "manifest": a["manifest"],
        "room": room,
        "room_problem": room_problem,
    }


def _plan(files: dict, dest: str, *, verify: bool, workers: int, algo: str) -> tuple[dict, dict]:
    """What the destination holds (assess) and which ranges of an interrupted run's partials can be
    resumed (each is re-hashed before it is kept). Under the lock, so no other stager changes it
    between this and the copy. Every other leftover partial is removed here: it is nobody's work
    any more and holds tmpfs memory."""
    a = assess(files, dest, verify=verify, workers=workers)
    ranges = _resumable(dest, a["todo"], files, algo)
    for rel in _partials(dest):
        if rel[: -len(PARTIAL)] not in ranges:
            os.unlink(os.path.join(dest, rel))
    return a, ranges


def _fix_modes(dest: str, files: dict, modes: dict) -> list[str]:
    """Permissions follow the source: a kept file whose mode was changed is set back in place (a
    chmod, no copy). Returns the files fixed (the summary's modes_fixed)."""
    for rel in sorted(modes):
        os.chmod(os.path.join(dest, rel), files[rel]["mode"])
    return sorted(modes)


def _room_needed(files: dict, dest: str, todo: dict, ranges: dict) -> int:
    """Bytes the copy adds to the destination: what a kept partial already holds is there."""
    need = sum(files[r]["size"] for r in todo)
    for rel in ranges:
        need -= min(files[rel]["size"], os.stat(temp_path(os.path.join(dest, rel))).st_blocks * 512)
    return max(0, need)


def _unpublish(dest: str, a: dict, ranges: dict, sync: bool) -> dict:
    """From here the directory must not look complete: the journal is rewritten with the kept
    files' entries and the resumable ranges (so an interruption from now on resumes instead of
    starting over), then the manifest goes, then files removed from the source. Returns the kept
    entries (rel -> manifest entry)."""
    os.makedirs(dest, exist_ok=True)
    kept = {r: a["known"][r] for r in a["keep"]}
    _write_atomic(
        os.path.join(dest, JOURNAL),
        b"".join((json.dumps({**e, "rel": r}) + "\n").encode() for r, e in kept.items())
        + b"".join((json.dumps(e) + "\n").encode() for recs in ranges.values() for e in recs),
        sync,
    )
    try:
        os.unlink(os.path.join(dest, MANIFEST))
    except FileNotFoundError:
        pass
    for rel in a["stale"]:
        os.unlink(os.path.join(dest, rel))
    return kept


def _copy_pass(src, dest, files, todo, ranges, need, workers, sync, algo, progress, on_file) -> Copier:
    """Copy the files to copy (Copier: ranges across threads, the cold probe, checksums, the
    journal), with the progress bar around it stopped whatever happens. Returns the Copier (its
    `done` entries and read figures)."""
    started = progress is not None and need > 0
    if started:
        progress.start(need, f"staging {os.path.basename(dest)}")
    try:
        copier = Copier(
            src,
            dest,
            {r: files[r] for r in todo},
            workers=workers,
            sync=sync,
            algo=algo,
            advance=progress.advance if started else None,
            on_file=on_file,
            resume={
                r: {int(e["range"]): bytes.fromhex(e["digest"]) for e in recs} for r, recs in ranges.items()
            },
        )
        copier.run()
    finally:
        if started:
            progress.stop()
    return copier


def _publish(
    src: str,
    dest: str,
    files: dict,
    fp: str,
    entries: dict,
    *,
    algo: str,
    sync: bool,
    require_tokenizer: bool,
    force: bool,
    source_info: dict | None,
) -> None:
    """The copy's own integrity check, then the manifest, written last and atomically: only now does
    the directory count as staged. The journal is not needed any more once the manifest holds
    every entry."""
    problems = stc.check_model(dest, {r: None for r in entries}, require_tokenizer)
    if problems and not force:
        raise StageError(
            f"staged copy {dest} fails its integrity check: {problems[0]}",
            "check the source, then re-run",
        )
    manifest = {
        "schema": SCHEMA,
        "hash": algo,
        "chunk": CHUNK,  # per file: "algo" (kept files keep theirs)
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": {
            "path": (source_info or {}).get("path", src),
            "fingerprint": fp,
            "files": len(files),
            "bytes": sum(f["size"] for f in files.values()),
            **{k: v for k, v in (source_info or {}).items() if k != "path"},
        },
        "files": {r: {k: v for k, v in entries[r].items() if k != "rel"} for r in sorted(entries)},
    }
    _write_atomic(os.path.join(dest, MANIFEST), json.dumps(manifest, indent=1).encode(), sync)
    os.unlink(os.path.join(dest, JOURNAL))


def _partials(dest: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(dest):
        out += [os.path.relpath(os.path.join(dirpath, n), dest) for n in names if n.endswith(PARTIAL)]
    return out


# -- progress (rich, optional) ---------------------------------------------------------------
class RichProgress:
    """Bytes, bytes/s and ETA with rich; start/advance/stop as stage() expects (thread-safe)."""

    def __init__(self, console=None):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task = None

    def start(self, total: int, description: str) -> None:
        self._p.start()
        self._task = self._p.add_task(description, total=total)

    def advance(self, n: int) -> None:
        self._p.advance(self._task, n)

    def stop(self) -> None:
        self._p.stop()


class LineProgress:
    """start/advance/stop as gpubox.progress lines on stderr: a remote stage's progress, which the
    control node relays into its own bar (bytes, rate, ETA). Stdlib only (this file is the payload).
    Advances are batched to a line per `every` s, and a line goes out at least every `alive` s even
    while no byte moves, so a quiet remote is a hung one."""

    PREFIX = "gpubox-progress "  # gpubox.progress.PREFIX

    def __init__(self, stream=None, every: float = 0.25, alive: float = 1.0):
        self.stream, self.every, self.alive = stream or sys.stderr, every, alive
        self._lock = threading.Lock()
        self._pending = 0
        self._last = 0.0
        self._done = threading.Event()
        self._thread = None

    def _emit(self, **ev) -> None:
        self.stream.write(self.PREFIX + json.dumps(ev, separators=(",", ":")) + "\n")
        self.stream.flush()
        self._last = time.monotonic()

    def _flush(self, force: bool) -> None:
        with self._lock:
            if self._pending or force:
                n, self._pending = self._pending, 0
                self._emit(ev="advance", n=n)

    def _tick(self) -> None:
        while not self._done.wait(self.every):
            self._flush(force=time.monotonic() - self._last >= self.alive)

    def start(self, total: int, description: str) -> None:
        with self._lock:
            self._emit(ev="start", total=int(total), desc=description)
        self._done.clear()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def advance(self, n: int) -> None:
        with self._lock:
            self._pending += n

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._flush(force=False)
        with self._lock:
            self._emit(ev="stop")


def rich_progress(console=None):
    """A RichProgress when rich is importable, else None (remote containers without rich)."""
    try:
        return RichProgress(console)
    except ImportError:
        return None


# -- entry points ----------------------------------------------------------------------------
def run_request(req: dict, progress=None) -> dict:
    """One operation described as data (what travels to a remote container as --request JSON)."""
    op = req.get("op", "stage")
    common = {
        "verify": bool(req.get("verify")),
        "require_tokenizer": req.get("require_tokenizer", True),
        "workers": req.get("workers"),
        "follow_links": bool(req.get("follow_links")),
    }
    if op == "check":
        return check(req["src"], req["dest"], **common)
    if op == "stage":
        return stage(
            req["src"],
            req["dest"],
            force=bool(req.get("force")),
            dry_run=bool(req.get("dry_run")),
            cgroup_dir=req.get("cgroup_dir"),
            tmpfs=req.get("tmpfs"),
            source_info=req.get("source_info"),
            progress=progress,
            hash=req.get("hash"),
            **common,
        )
    raise StageError(f"unknown operation {op!r}", "use check or stage")


def main(argv: list[str] | None = None) -> int:
    """`stage.py SRC DEST [--verify] [--force] [--dry-run] [--check] [--hash crc32|sha256]` or
    `--request JSON`; prints JSON.
    Exit 0 done/staged, 1 not staged (--check), 2 could not run."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="stage.py",
        description="Stage a model directory into tmpfs: fast, hash-verified, atomic, resumable.",
    )
    ap.add_argument("src", nargs="?")
    ap.add_argument("dest", nargs="?")
    ap.add_argument("--request", help="the operation as JSON (used by gpubox)")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--follow-links", action="store_true", help="stage files linked from outside the source")
    ap.add_argument(
        "--hash", choices=sorted(HASHES), help=f"chunk hash for copied files (default {DEFAULT_HASH})"
    )
    args = ap.parse_args(argv)
    if args.request:
        req = json.loads(args.request)
    elif args.src and args.dest:
        req = {
            "op": "check" if args.check else "stage",
            "src": args.src,
            "dest": args.dest,
            "verify": args.verify,
            "force": args.force,
            "dry_run": args.dry_run,
            "workers": args.workers,
            "hash": args.hash,
            "follow_links": args.follow_links,
        }
    else:
        ap.error("give SRC DEST or --request JSON")
    progress = rich_progress() if sys.stderr.isatty() else None
    if req.get("progress") == "lines":  # run by gpubox on another host: it relays these lines live
        progress = LineProgress()
    try:
        out = run_request(req, progress)
    except StageError as exc:
        print(json.dumps({"error": exc.problem, "fix": exc.fix}))
        return 2
    except OSError as exc:
        print(
            json.dumps(
                {
                    "error": f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "),
                    "fix": "check the paths and permissions",
                }
            )
        )
        return 2
    print(json.dumps(out))
    return 0 if out.get("staged", True) else 1


if __name__ == "__main__":
    sys.exit(main())
