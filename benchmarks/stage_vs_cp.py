#!/usr/bin/env python3
"""Staging a model into tmpfs: `gpubox stage` (checksummed) vs what an admin would run, warm and cold.

Generates a model-like directory on disk (safetensors shards of varying size + config/tokenizer files,
fsync'd), then in every round, alternating the tools so drift hits all alike:

  warm  (the whole source read before each run):
        cp -r SRC DEST | xargs -0 -P N -n 1 cp -t DEST (parallel per-file cp, N = the CPUs this process
        may use) | rsync -a (where installed) | gpubox (default checksum) | gpubox crc32 | gpubox sha256
        [| variants: --variant-warm NAME:ENV=VALUE,...] [| gpubox before: --before FILE]
  cold  (the source's pages evicted before each run: posix_fadvise(POSIX_FADV_DONTNEED) on its own
        files, and with --drop-caches also `echo 3 > /proc/sys/vm/drop_caches`, for a machine where
        that is allowed; never on a shared one):
        the disk anchor (below) | cp -r | xargs cp | gpubox default | crc32 | sha256 [| variants: --variant
        NAME:ENV=VALUE,... (read-path settings)] [| gpubox before]

The disk anchor is the best of several read-only strategies over every source file in the same run
(each cold): O_DIRECT over 64 MiB ranges of every file with 2N threads x 8 MiB and 4N x 16 MiB reads
(deep queues, large blocks), buffered reads over the ranges with N threads, and one buffered stream per
file (what parallel cp reads like: the kernel's readahead grows along each file). Measured and left
out after a first device run (each below these there): O_DIRECT N x 4 MiB, one O_DIRECT stream per
file (the earlier anchor), buffered ranges with POSIX_FADV_WILLNEED. io_uring is not used: no
well-kept PyPI library for it (threads blocked in preadv give the queue depth). fio is added where
installed.

Residency is checked, not assumed: before every cold run cachestat(2) counts the source's cached
bytes (and preadv2(RWF_NOWAIT) probes 64 offsets per file where cachestat is missing); the share is
printed per run. gpubox is provision/stage/ (the engine `gpubox stage SRC DEST` calls in-process)
run as a package from its own folder, `python3 -c "...import stage; stage.main()" SRC DEST`: a whole
process, interpreter start included.

    python benchmarks/stage_vs_cp.py                                    # 4 GB, 3 rounds
    python benchmarks/stage_vs_cp.py --size 8 --rounds 2 --json-out res.json
    taskset -c 0,1 python benchmarks/stage_vs_cp.py --size 2 --paired 5  # the 2-core goal

Goals (issue 30), printed as ratios: cold gpubox rate >= 1.0x `xargs -P N cp` and >= 0.95 of the disk
anchor; warm gpubox rate >= 1.0x `xargs -P N cp`; CPU-s per GB <= 2x `cp -r`'s with the default
checksum, <= 3x with sha256; --paired: median wall gpubox / cp -r <= 1.0 over K paired runs. CPU
seconds, minor faults and context switches are the children's rusage (xargs's cp children included).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "provision" / "stage"
sys.path.insert(0, str(ENGINE.parent))
import stage as engine  # noqa: I001  (the stdlib-only engine, for cachestat and its default checksum)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tmpfs_fill  # noqa: E402  (the tmpfs's own ceiling, benchmarks/tmpfs_fill.py)

GB = 1e9
RANGE = 64 << 20
MIB = 1 << 20


def ncpu() -> int:
    return engine.cpu_count()


# -- the source ------------------------------------------------------------------------------
def shard_sizes(total_gb: float) -> list[int]:
    """Shards of varying size like a real checkpoint's (last one small), adding up to total_gb."""
    weights = [1.0, 1.0, 0.95, 0.9, 0.85, 0.8, 0.5, 0.2]
    s = sum(weights)
    return [max(1 << 20, int(total_gb * GB * w / s)) // 2048 * 2048 for w in weights]


def _shard(path: Path, nbytes: int, name: str, block: bytearray, counter: list) -> None:
    """One BF16 tensor of 1024 columns in the safetensors format (8-byte LE header length + JSON)."""
    hdr = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            name: {"dtype": "BF16", "shape": [nbytes // 2048, 1024], "data_offsets": [0, nbytes]},
        }
    )
    raw = hdr.encode() + b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        left = nbytes
        while left:
            counter[0] += 1  # fresh bytes per block without urandom for every GB
            block[:8] = counter[0].to_bytes(8, "little")
            n = min(left, len(block))
            f.write(memoryview(block)[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())  # clean pages: DONTNEED can evict them


LAYOUTS = ("sharded", "one-big", "big-plus-small", "many-small")


def layout_files(layout: str, total_gb: float) -> list[tuple[str, int]]:
    """(name, bytes) of the weights files of a model of `layout`: "sharded" (8 shards of varying
    size, the default), "one-big" (one model.safetensors: a single-file checkpoint; config and
    tokenizer beside it), "big-plus-small" (one big shard and 20 small files of 256 KiB beside it),
    "many-small" (32 MiB shards)."""
    total = int(total_gb * GB) // 2048 * 2048
    if layout == "sharded":
        sizes = shard_sizes(total_gb)
        return [(f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors", s) for i, s in enumerate(sizes)]
    if layout in ("one-big", "big-plus-small"):
        return [("model.safetensors", total - (20 << 18 if layout == "big-plus-small" else 0))]
    if layout == "many-small":
        n = max(1, total // (32 * MIB))
        return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", total // n // 2048 * 2048) for i in range(n)]
    raise SystemExit(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")


def generate(src: Path, total_gb: float, layout: str = "sharded") -> int:
    src.mkdir(parents=True)
    files = layout_files(layout, total_gb)
    sizes = [s for _, s in files]
    weight_map = {}
    todo = queue.Queue()
    for i, f in enumerate(files):
        todo.put((i, f))

    def worker() -> None:
        block = bytearray(os.urandom(16 << 20))
        while True:
            try:
                i, (rel, size) = todo.get_nowait()
            except queue.Empty:
                return
            t = f"model.layers.{i}.weight"
            _shard(src / rel, size, t, block, [i << 40])
            weight_map[t] = rel

    ts = [threading.Thread(target=worker) for _ in range(min(8, len(files)))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if layout == "big-plus-small":
        for k in range(20):
            (src / f"extra-{k:02d}.txt").write_bytes(os.urandom(1 << 18))
    docs = {
        "config.json": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "torch_dtype": "bfloat16",
        },
        "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}},
        "tokenizer_config.json": {"tokenizer_class": "Qwen2Tokenizer"},
    }
    if len(files) > 1:
        docs["model.safetensors.index.json"] = {
            "metadata": {"total_size": sum(sizes)},
            "weight_map": dict(sorted(weight_map.items())),
        }
    for rel, doc in docs.items():
        (src / rel).write_text(json.dumps(doc) + "\n")
    os.sync()
    return sum(p.stat().st_size for p in src.iterdir())


def source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.is_file())


# -- page cache: warm, cold, checked ----------------------------------------------------------
def warm(src: Path) -> None:
    """Read every source file (a thread each: 16 GB would take seconds in one)."""

    def read(p: Path) -> None:
        buf = bytearray(8 << 20)
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    ts = [threading.Thread(target=read, args=(p,)) for p in source_files(src)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def evict(src: Path, drop_caches: bool) -> None:
    """Drop this source's pages (its files are clean: fsync'd when written); with drop_caches also
    the whole page cache (`echo 3 > /proc/sys/vm/drop_caches`: only where --drop-caches says so)."""
    for p in source_files(src):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if drop_caches:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def cached_share(src: Path, probes: int = 64) -> float | None:
    """Share of the source's bytes in the page cache: cachestat(2) where the kernel has it, else the
    share of probe offsets that preadv2(RWF_NOWAIT) finds cached; None where neither works."""
    files = source_files(src)
    total = cached = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            c = engine.cached_bytes(fd, 0, size)
        finally:
            os.close(fd)
        if c is None:
            break
        total, cached = total + size, cached + min(size, c)
    else:
        return cached / total if total else None
    if not hasattr(os, "RWF_NOWAIT"):
        return None
    buf, hit, n = bytearray(4096), 0, 0
    for p in files:
        size = p.stat().st_size
        fd = os.open(p, os.O_RDONLY)
        try:
            for k in range(probes if size > probes * 4096 else 1):
                n += 1
                try:
                    os.preadv(fd, [buf], (size * k // probes) // 4096 * 4096, os.RWF_NOWAIT)
                    hit += 1
                except BlockingIOError:
                    pass
                except OSError:
                    return None
        finally:
            os.close(fd)
    return hit / n if n else None


# -- the disk anchor: read strategies ----------------------------------------------------------
def _ranges(src: Path) -> list[tuple[Path, int, int]]:
    out = []
    for p in source_files(src):
        size = p.stat().st_size
        out += [(p, off, min(size, off + RANGE)) for off in range(0, size, RANGE)] or [(p, 0, 0)]
    return out


def read_ranges(src: Path, threads: int, block: int, direct: bool, willneed: int = 0) -> float | None:
    """Seconds to read every source file once: `threads` readers take 64 MiB ranges from one queue
    (largest file first) and read each with `block`-byte preadv, O_DIRECT or buffered (own fd per
    range, POSIX_FADV_SEQUENTIAL; `willneed`: POSIX_FADV_WILLNEED that far ahead). None: refused."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    for r in _ranges(src):
        q.put(r)
    failed: list[Exception] = []

    def reader() -> None:
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT requires
        try:
            while not failed:
                try:
                    p, start, end = q.get_nowait()
                except queue.Empty:
                    return
                fd = os.open(p, os.O_RDONLY | (os.O_DIRECT if direct else 0))
                try:
                    if not direct:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                        if willneed:
                            os.posix_fadvise(fd, start, min(willneed, end - start), os.POSIX_FADV_WILLNEED)
                    off = start
                    while off < end:
                        if willneed and off + willneed < end:
                            os.posix_fadvise(fd, off + willneed, min(block, end - off - willneed), 4)
                        n = os.preadv(fd, [buf], off)
                        if n <= 0:
                            break
                        off += n
                finally:
                    os.close(fd)
        except OSError as exc:
            failed.append(exc)
        finally:
            buf.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=reader) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    return None if failed else dt


def stream_per_file(src: Path, direct: bool) -> float | None:
    """One stream per file, as parallel cp reads: O_DIRECT 4 MiB reads, or buffered 1 MiB reads with
    POSIX_FADV_SEQUENTIAL (the kernel's readahead growing along the whole file)."""
    failed: list[Exception] = []

    def read(p: Path) -> None:
        try:
            fd = os.open(p, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        except OSError as exc:
            failed.append(exc)
            return
        buf = mmap.mmap(-1, 4 * MIB if direct else MIB)
        try:
            if not direct:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            off = 0
            while (n := os.preadv(fd, [buf], off)) > 0:
                off += n
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(fd)
            buf.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=read, args=(p,)) for p in source_files(src)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return None if failed else time.perf_counter() - t0


def anchors(src: Path, n: int) -> dict:
    """name -> () -> seconds | None: the read strategies measured for the disk anchor."""
    out = {}
    for threads, block in ((2 * n, 8 * MIB), (4 * n, 16 * MIB)):
        out[f"O_DIRECT {threads} thr x {block // MIB} MiB"] = lambda t=threads, b=block: read_ranges(
            src, t, b, direct=True
        )
    out[f"buffered {n} thr x 1 MiB ranges"] = lambda: read_ranges(src, n, MIB, direct=False)
    out["buffered stream per file"] = lambda: stream_per_file(src, direct=False)
    return out


def fio_read(src: Path, n: int) -> float | None:
    """fio's O_DIRECT read of the biggest source file in GB/s (libaio, iodepth 32, 4 MiB, n jobs
    over offsets), when fio is installed."""
    fio = shutil.which("fio")
    if not fio:
        return None
    big = max(source_files(src), key=lambda p: p.stat().st_size)
    r = subprocess.run(
        [
            fio,
            "--name=seqread",
            f"--filename={big}",
            "--rw=read",
            "--bs=4M",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=32",
            f"--numjobs={n}",
            "--offset_increment=" + str(big.stat().st_size // n // MIB) + "M",
            f"--size={big.stat().st_size // n // MIB}M",
            "--group_reporting",
            "--readonly",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
    )
    try:
        return json.loads(r.stdout)["jobs"][0]["read"]["bw_bytes"] / GB
    except (ValueError, KeyError, IndexError):
        return None


# -- checksums: what each costs here -------------------------------------------------------------
def hash_rates(n: int, mib: int = 512) -> dict:
    """GB/s of each candidate checksum from 1 MiB buffers (the engine's slice): 1 thread, n threads."""
    import hashlib
    import zlib

    cands = {
        "crc32 (zlib)": lambda: _Fold(zlib.crc32),
        "sha256 (hashlib)": hashlib.sha256,
    }
    try:
        import xxhash

        cands["xxh3_64 (xxhash)"] = xxhash.xxh3_64
        cands["xxh3_128 (xxhash)"] = xxhash.xxh3_128
    except ImportError:
        pass
    try:
        import crc32c

        cands["crc32c (crc32c)"] = lambda: _Fold(crc32c.crc32c)
    except ImportError:
        pass
    try:
        import blake3

        cands["blake3 (blake3, 1 thread)"] = blake3.blake3
        cands["blake3 (blake3, max_threads)"] = lambda: blake3.blake3(max_threads=blake3.blake3.AUTO)
    except ImportError:
        pass
    buf = mmap.mmap(-1, MIB)
    buf.write(os.urandom(MIB))
    view = memoryview(buf)
    out = {}
    for name, mk in cands.items():

        def run(k: int, mk=mk) -> None:
            h = mk()
            for _ in range(k):
                h.update(view)

        run(8)
        t0 = time.perf_counter()
        run(mib)
        one = mib * MIB / GB / (time.perf_counter() - t0)
        ts = [threading.Thread(target=run, args=(mib // 2,)) for _ in range(n)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[name] = {
            "1 thread": round(one, 2),
            f"{n} threads": round(n * mib // 2 * MIB / GB / (time.perf_counter() - t0), 2),
        }
    return out


class _Fold:
    def __init__(self, fn):
        self.fn, self.v = fn, 0

    def update(self, b) -> None:
        self.v = self.fn(b, self.v)


# -- the tools -------------------------------------------------------------------------------
def timed(argv: list[str], stdin: bytes | None = None, env: dict | None = None) -> dict:
    """Wall seconds and the child's rusage (CPU user+sys, minor faults, context switches)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run(argv, input=stdin, capture_output=True, env=env)
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed ({r.returncode}): {r.stderr.decode()[-300:]}")
    return {
        "s": dt,
        "cpu": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
        "sys": r1.ru_stime - r0.ru_stime,  # the kernel's share: copies, page cache, tmpfs, locks
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "vcsw": r1.ru_nvcsw - r0.ru_nvcsw,
        "ivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
        "out": r.stdout,
    }


GPUBOX = f"gpubox {engine.DEFAULT_HASH}"  # the default checksum's row
# The engine as a module, so its bytecode comes from __pycache__ like `gpubox stage`'s does (a script
# named on the command line is compiled again at every start: ~30 ms for the engine)
ENGINE_ARGV = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, {str(ENGINE.parent)!r}); import stage; sys.exit(stage.main())",
]


def tools(src: Path, before: str | None, variants: dict[str, dict]) -> dict:
    """name -> run(dest) -> rusage dict; cp-like tools first (the anchors), then gpubox."""
    n = ncpu()
    listing = b"\0".join(str(p).encode() for p in source_files(src))

    def xargs_cp(d: Path) -> dict:
        d.mkdir()
        return timed(["xargs", "-0", "-P", str(n), "-n", "1", "cp", "-t", str(d)], stdin=listing)

    def gpubox(*extra: str, env: dict | None = None):
        return lambda d: timed([*ENGINE_ARGV, str(src), str(d), *extra], env=env)

    out = {"cp -r": lambda d: timed(["cp", "-r", str(src), str(d)])}
    if shutil.which("xargs"):
        out[f"xargs -P{n} cp"] = xargs_cp
    if shutil.which("rsync"):
        out["rsync -a"] = lambda d: timed(["rsync", "-a", f"{src}/", f"{d}/"])
    out[GPUBOX] = gpubox()
    for name in ("crc32", "sha256"):
        if name != engine.DEFAULT_HASH:
            out[f"gpubox {name}"] = gpubox("--hash", name)
    for name, spec in variants.items():
        opts, env = _variant_run(spec)
        out[f"gpubox {name}"] = gpubox(*opts, env=env)
    if before:
        # as a module too (its __pycache__ beside it), the same start-up as the engine's row
        b = Path(before).resolve()
        argv = [
            sys.executable,
            "-c",
            f"import sys, importlib; sys.path.insert(0, {str(b.parent)!r}); "
            f"sys.exit(importlib.import_module({b.stem!r}).main())",
        ]
        out["gpubox before"] = lambda d: timed([*argv, str(src), str(d)])
    return out


def parse_variant(text: str) -> tuple[str, dict]:
    """NAME:ENV=VALUE[,ENV=VALUE...] (e.g. direct:GPUBOX_STAGE_DIRECT=1); an item --OPT=VALUE is
    passed to the copier as an option instead (e.g. sha256-w2:GPUBOX_STAGE_WRITERS_PER_FILE=2,--hash=sha256)."""
    name, _, spec = text.partition(":")
    env = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
    if not name or not env:
        raise SystemExit(f"--variant {text!r}: give NAME:ENV=VALUE[,ENV=VALUE]")
    return name, env


def _variant_run(env: dict) -> tuple[list[str], dict]:
    """A variant's copier options (--OPT=VALUE items) and environment (the rest)."""
    opts = [a for k, v in env.items() if k.startswith("--") for a in (k, v)]
    return opts, {**os.environ, **{k: v for k, v in env.items() if not k.startswith("--")}}


# -- the run ---------------------------------------------------------------------------------
def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=4.0, help="model size in GB (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument(
        "--layout",
        action="append",
        choices=LAYOUTS,
        help="model layout, repeatable (each one measured in turn, its own table): sharded (default), "
        "one-big (one model.safetensors), big-plus-small (one big shard + 20 small files), many-small "
        "(32 MiB shards)",
    )
    ap.add_argument(
        "--workdir", default=None, help="disk directory for the source (default: a temp dir in /var/tmp)"
    )
    ap.add_argument("--tmpfs", default="/dev/shm", help="tmpfs directory to stage into (default /dev/shm)")
    ap.add_argument("--no-cold", action="store_true", help="warm runs only")
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write 3 to /proc/sys/vm/drop_caches before each cold run (root, a machine of your own)",
    )
    ap.add_argument("--paired", type=int, default=0, help="K: only K paired runs of cp -r and gpubox")
    ap.add_argument(
        "--variant", action="append", default=[], help="NAME:ENV=VALUE,... a gpubox variant (cold runs)"
    )
    ap.add_argument(
        "--variant-warm",
        action="append",
        default=[],
        help="NAME:ENV=VALUE,... a gpubox variant run warm (a NAME also given to --variant: warm and cold)",
    )
    ap.add_argument(
        "--skip", action="append", default=[], help="a tool's row not to run (e.g. 'gpubox crc32')"
    )
    ap.add_argument(
        "--skip-cold", action="append", default=[], help="a tool's row not to run cold (warm still)"
    )
    ap.add_argument(
        "--before",
        help="an earlier engine to time beside, warm and cold: a provision/stage.py or provision/stage/ "
        "(from git show or git archive, with its safetensors_check.py in the same directory)",
    )
    ap.add_argument("--budget", type=float, default=0, help="seconds: no new round after this (0: none)")
    ap.add_argument(
        "--no-fill",
        action="store_true",
        help="do not measure the tmpfs's fill ceiling (benchmarks/tmpfs_fill.py) before the layouts",
    )
    ap.add_argument("--json-out", help="also write the figures as JSON to this file")
    args = ap.parse_args()
    cold_v = dict(parse_variant(v) for v in args.variant)
    warm_v = dict(parse_variant(v) for v in args.variant_warm)
    for name in set(cold_v) & set(warm_v):
        if cold_v[name] != warm_v[name]:
            raise SystemExit(f"variant {name!r} is given twice with different settings")
    variants = {**cold_v, **warm_v}
    args.warm_variants, args.cold_variants = set(warm_v), set(cold_v)

    t_start = time.perf_counter()
    need = args.size * GB * 1.15
    if shutil.disk_usage(args.tmpfs).free < need:
        raise SystemExit(
            f"{args.tmpfs} has {shutil.disk_usage(args.tmpfs).free / GB:.1f} GB free, needs "
            f"{need / GB:.1f} GB: use --size smaller"
        )
    work = Path(tempfile.mkdtemp(prefix="gpubox-bench-", dir=args.workdir or "/var/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="gpubox-bench-", dir=args.tmpfs))
    # the cold probe's verdicts (kept per source filesystem) in this run's own state directory: the
    # first cold gpubox run probes, later ones reuse the verdict as the next reboot would; a
    # variant with GPUBOX_STAGE_STATE_DIR= (empty) probes in every run
    os.environ.setdefault("GPUBOX_STAGE_STATE_DIR", str(work / "state"))
    results: list[dict] = []
    fill = None
    if not (args.paired or args.no_fill):  # what the tmpfs itself allows, in the same run
        fill = tmpfs_fill.measure(args.tmpfs, min(args.size, 4.0), ncpu(), rounds=2)
        for k, v in fill.items():
            log(f"fill ceiling: {k:36} {v:6.2f} GB/s")
    try:
        for layout in args.layout or ["sharded"]:
            src = work / layout / "Model"
            t0 = time.perf_counter()
            total = generate(src, args.size, layout)
            nfiles = len(source_files(src))
            log(
                f"generated {src} ({layout}): {nfiles} files, {total / GB:.2f} GB "
                f"in {time.perf_counter() - t0:.1f} s"
            )
            if args.paired:
                res = paired(
                    src, shm, total, args.paired, args.drop_caches and not args.no_cold, args.no_cold
                )
            else:
                res = rounds(src, shm, total, nfiles, args, variants, t_start)
            res["layout"] = layout
            if fill:
                # this layout's own bounds: at most `big` pwrite writers (one per big file), and
                # the same writes with the bytes read from its largest file (warm) on the way, at
                # the layout's own size (as much to allocate as the copies it bounds; run R timed
                # them at 4 GB)
                files = sorted(source_files(src), key=lambda p: -p.stat().st_size)
                big = sum(1 for p in files if p.stat().st_size >= RANGE)
                only = (
                    {tmpfs_fill.COPY_EACH, *tmpfs_fill.k_files(big)}
                    if big > 1
                    else set(tmpfs_fill.COPY_ONE_FILE)
                )
                warm(src)
                shards = tmpfs_fill.measure(
                    args.tmpfs,
                    args.size,
                    ncpu(),
                    rounds=2,
                    files=big if big > 1 else 0,
                    only=only,
                    source=str(files[0]),
                )
                add_fill(res, fill, shards)
            results.append(res)
            shutil.rmtree(work / layout, ignore_errors=True)  # the disk holds one layout at a time
            print(f"\n== layout {layout} ==")
            (print_paired if args.paired else print_table)(res)
            sys.stdout.flush()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    if args.json_out:
        out = results[0] if len(results) == 1 else results
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def add_fill(res: dict, fill: dict, shards: dict) -> None:
    """The tmpfs's fill ceilings (tmpfs_fill.measure: new pages written from a cached buffer by as
    many threads as CPUs, no source read, no checksum) and each warm row against the ones that
    bound it: a copier of this layout writes at most that fast, and reads the source too. One big
    file (alone or beside small ones): the best way into one file that allocates its pages
    (pwrite, or a mapping, however allocated). Shards (`shards`: the fills of as many files as the
    layout has big ones, at most one pwrite writer per file at a time, with and without faulting
    writers beside): those, and pwrite into a file per thread (no lock shared: no layout copies
    faster). `shards` also holds the "copy:" cases (the same writes reading the layout's largest
    file on the way, no checksum): the bound of a copier that does nothing but copy."""
    fill = {**fill, **shards}
    res["fill_ceiling_gb_s"] = {k: round(v, 3) for k, v in fill.items()}
    many = any(k.endswith(" files") for k in shards)  # several big files: tmpfs_fill.k_files
    if not many:  # one big file (beside small ones): every way into one file that allocates its pages
        bounds = {"one file, the best way": max(fill[k] for k in tmpfs_fill.ONE_FILE if k in fill)}
        copies = [shards[k] for k in tmpfs_fill.COPY_ONE_FILE if k in shards]
        if copies:
            bounds["a copy into one file, the best way"] = max(copies)
    else:
        bounds = {"pwrite, a file per thread": fill["tmpfs pwrite, a file each"]}
        bounds.update({k.removeprefix("tmpfs "): v for k, v in shards.items()})
    res["fill_bound_gb_s"] = {k: round(v, 3) for k, v in bounds.items()}
    xa = next((k for k in res["warm"] if k.startswith("xargs")), None)
    for which, bound in bounds.items():
        for k, r in res["warm"].items():
            res["ratios"][f"warm: {k} rate / bound ({which}, {bound:.2f} GB/s)"] = round(r["gb_s"] / bound, 3)
        # the goals (issue 41) as a share of the bound: one big file >= 2.5x cp -r, shards >= 1.5x xargs
        goal = ("cp -r", 2.5) if not many else (xa, 1.5)
        beyond = "beyond this way of copying" if "copy" in which else "beyond this machine"
        if goal[0] in res["warm"]:
            res["ratios"][f"warm: {goal[1]}x {goal[0]}'s rate / bound ({which}; above 1: {beyond})"] = round(
                goal[1] * res["warm"][goal[0]]["gb_s"] / bound, 3
            )


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def _cold_run(src: Path, drop: bool) -> float | None:
    evict(src, drop)
    return cached_share(src)


def rounds(src: Path, shm: Path, total: int, nfiles: int, args, variants: dict, t_start: float) -> dict:
    n = ncpu()
    hashes = hash_rates(n)
    for k, v in hashes.items():
        log(f"checksum {k:30} " + ", ".join(f"{t}: {r:.2f} GB/s" for t, r in v.items()))
    tl = {k: v for k, v in tools(src, args.before, variants).items() if k not in args.skip}
    an = {} if args.no_cold else anchors(src, n)
    # --variant: read-path settings, nothing to measure warm; --variant-warm: warm (and cold when
    # the name is also a --variant)
    cold_only = {f"gpubox {k}" for k in variants if k not in args.warm_variants}
    warm_only = {f"gpubox {k}" for k in variants if k not in args.cold_variants}
    warm_runs: dict[str, list[dict]] = {k: [] for k in tl if k not in cold_only}
    skip_cold = ("rsync -a", *warm_only, *args.skip_cold)
    cold_runs: dict[str, list[dict]] = {k: [] for k in tl if k not in skip_cold}
    anchor_runs: dict[str, list[float]] = {k: [] for k in an}
    load0 = os.getloadavg()
    log(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; {n} CPUs")
    for rnd in range(args.rounds):
        if rnd and args.budget and time.perf_counter() - t_start > args.budget:
            log(f"budget of {args.budget:.0f} s spent: {rnd} round(s)")
            break
        names = list(warm_runs)
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:  # rotated: no tool always first
            dest = shm / "dest"
            warm(src)
            r = tl[name](dest)
            warm_runs[name].append(r)
            log(
                f"round {rnd + 1} warm: {name:28} {r['s']:6.2f} s {total / r['s'] / GB:5.2f} GB/s "
                f"cpu {r['cpu']:6.2f} s"
            )
            shutil.rmtree(dest)
        if args.no_cold:
            continue
        jobs = [("anchor", k) for k in an] + [("tool", k) for k in cold_runs]
        for kind, name in jobs[rnd % len(jobs) :] + jobs[: rnd % len(jobs)]:
            share = _cold_run(src, args.drop_caches)
            shown = "?" if share is None else f"{share:.1%}"
            if kind == "anchor":
                s = an[name]()
                if s is not None:
                    anchor_runs[name].append(total / s / GB)
                    log(
                        f"round {rnd + 1} cold: {name:28} {s:6.2f} s {total / s / GB:5.2f} GB/s (cached before: {shown})"
                    )
                continue
            dest = shm / "dest"
            r = tl[name](dest)
            r["cached_before"] = share
            if name.startswith("gpubox"):  # how it read the source
                doc = json.loads(r["out"])
                r["direct"] = doc.get("read_direct_bytes", 0) / total
                r["read"] = doc.get("read")
                r["engine_s"] = doc.get("seconds")  # stage() itself: the rest is interpreter start
            cold_runs[name].append(r)
            log(
                f"round {rnd + 1} cold: {name:28} {r['s']:6.2f} s {total / r['s'] / GB:5.2f} GB/s "
                f"cpu {r['cpu']:6.2f} s (cached before: {shown})"
                + (f" in-engine {r['engine_s']} s read {r['read']}" if r.get("read") else "")
            )
            shutil.rmtree(dest)
    load1 = os.getloadavg()
    dest = shm / "dest"  # a final staged copy: the no-op re-stage and --verify
    timed([*ENGINE_ARGV, str(src), str(dest)])
    noop = timed([*ENGINE_ARGV, str(src), str(dest)])
    assert json.loads(noop["out"])["copied"] == 0
    ver = timed([*ENGINE_ARGV, str(src), str(dest), "--verify"])
    assert json.loads(ver["out"])["verified"] == nfiles
    shutil.rmtree(dest)  # the next layout's first tool starts from no destination, and the tmpfs is empty
    fio = None if args.no_cold else fio_read(src, n)
    return summarise(total, nfiles, warm_runs, cold_runs, anchor_runs, fio, hashes, load0, load1, noop, ver)


def summarise(total, nfiles, warm_runs, cold_runs, anchor_runs, fio, hashes, load0, load1, noop, ver) -> dict:
    gb = total / GB

    def rows(runs):
        out = {}
        for k, v in runs.items():
            if not v:
                continue
            out[k] = {
                "median_s": round(med(v, "s"), 3),
                "gb_s": round(gb / med(v, "s"), 3),
                "cpu_s": round(med(v, "cpu"), 3),
                "cpu_s_per_gb": round(med(v, "cpu") / gb, 3),
                "sys_share": round(med(v, "sys") / med(v, "cpu"), 3) if med(v, "cpu") else None,
                "minflt": int(med(v, "minflt")),
                "vcsw": int(med(v, "vcsw")),
                "ivcsw": int(med(v, "ivcsw")),
                "runs_s": [round(r["s"], 3) for r in v],
            }
            if "cached_before" in v[0]:
                out[k]["cached_before"] = [
                    None if r["cached_before"] is None else round(r["cached_before"], 4) for r in v
                ]
            if "direct" in v[0]:
                out[k]["read_direct_share"] = round(med(v, "direct"), 3)
                if all(r.get("engine_s") is not None for r in v):  # wall minus stage()'s own seconds
                    out[k]["start_s"] = round(statistics.median(r["s"] - r["engine_s"] for r in v), 3)
                out[k]["read"] = [r.get("read") for r in v]
                # runs that probed (a verdict taken from the state directory carries probed_at)
                out[k]["probed"] = sum(
                    1 for r in v if "probe_gb_s" in (r.get("read") or {}) and "probed_at" not in r["read"]
                )
        return out

    w, c = rows(warm_runs), rows(cold_runs)
    xa = next((k for k in w if k.startswith("xargs")), "cp -r")  # without xargs: against cp -r
    disk = {k: round(statistics.median(v), 3) for k, v in anchor_runs.items() if v}
    if fio:
        disk["fio libaio iodepth 32"] = round(fio, 3)
    # the anchor: the best read strategy; a copier that beat it shows the anchor was not the disk's best
    disk_rate = max(disk.values()) if disk else None

    def rate(a, b, rows):  # None where a row was skipped
        return rows[a]["gb_s"] / rows[b]["gb_s"] if a in rows and b in rows else None

    def cpu(a, b, rows):
        return rows[a]["cpu_s"] / rows[b]["cpu_s"] if a in rows and b in rows else None

    ratios = {
        f"warm: {GPUBOX} rate / {xa}'s (goal >= 1.0)": rate(GPUBOX, xa, w),
        f"warm: gpubox sha256 rate / {xa}'s": rate("gpubox sha256", xa, w),
        f"warm: {GPUBOX} CPU/GB / cp -r's (goal <= 2)": cpu(GPUBOX, "cp -r", w),
        "warm: gpubox sha256 CPU/GB / cp -r's (goal <= 3)": cpu("gpubox sha256", "cp -r", w),
    }
    sha1 = hashes.get("sha256 (hashlib)", {}).get("1 thread")
    if sha1 and "cp -r" in w:
        # the least any copier that reads, writes and sha256-hashes each byte once can spend: the
        # hash at its one-thread rate (its best CPU per byte) plus a copy as cheap as cp -r's
        cp_gb = w["cp -r"]["cpu_s_per_gb"]
        ratios["warm: sha256 floor: 1-thread sha256 CPU/GB + cp -r's, / cp -r's"] = (1 / sha1 + cp_gb) / cp_gb
    if "gpubox crc32" in w:
        ratios["warm: gpubox crc32 CPU/GB / cp -r's"] = cpu("gpubox crc32", "cp -r", w)
    if "gpubox before" in w:
        ratios[f"warm: gpubox before rate / {xa}'s"] = rate("gpubox before", xa, w)
    for k in w:
        if k.startswith("gpubox ") and k not in (GPUBOX, "gpubox sha256", "gpubox crc32", "gpubox before"):
            ratios[f"warm: {k} rate / {xa}'s"] = rate(k, xa, w)
            ratios[f"warm: {k} CPU/GB / cp -r's"] = cpu(k, "cp -r", w)
    if c:
        ratios[f"cold: {GPUBOX} rate / {xa}'s (goal >= 1.0)"] = rate(GPUBOX, xa, c)
        for k in c:
            if k.startswith("gpubox ") and k not in (GPUBOX, "gpubox sha256"):
                ratios[f"cold: {k} rate / {xa}'s"] = rate(k, xa, c)
        ratios["cold: gpubox sha256 rate / " + xa + "'s"] = rate("gpubox sha256", xa, c)
        if "gpubox before" in c:
            ratios[f"cold: {GPUBOX} rate / gpubox before's"] = rate(GPUBOX, "gpubox before", c)
        ratios[f"cold: {GPUBOX} CPU/GB / cp -r's"] = cpu(GPUBOX, "cp -r", c)
        if disk_rate:
            for k in c:
                goal = " (goal >= 0.95)" if k == GPUBOX else ""
                ratios[f"cold: {k} rate / disk anchor{goal}"] = c[k]["gb_s"] / disk_rate
    cached = [x for r in c.values() for x in r.get("cached_before", []) if x is not None]
    return {
        "bytes": total,
        "files": nfiles,
        "cpus": ncpu(),
        "default_hash": engine.HASH_ALGO,
        "rounds": len(next(iter(warm_runs.values()))),
        "checksums_gb_s": hashes,
        "warm": w,
        "cold": c,
        "disk_read_gb_s": disk,
        "disk_anchor_gb_s": disk_rate,
        "cold_cached_share_before_runs_max": round(max(cached), 4) if cached else None,
        "ratios": {k: round(v, 3) for k, v in ratios.items() if v is not None},
        "noop_restage_s": round(noop["s"], 3),
        "verify_s": round(ver["s"], 3),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
    }


def print_table(res: dict) -> None:
    gb = res["bytes"] / GB
    print(
        f"\n{res['files']} files, {gb:.2f} GB, disk -> tmpfs, {res['rounds']} round(s), {res['cpus']} CPUs, "
        f"default checksum {res['default_hash']}; "
        f"load average {res['load_before'][0]:.2f} before, {res['load_after'][0]:.2f} after"
    )
    for k, v in res["checksums_gb_s"].items():
        print(f"checksum {k:30} " + ", ".join(f"{t}: {r:.2f} GB/s" for t, r in v.items()))
    print(
        f"{'cache':5} {'tool':28} {'median s':>9} {'GB/s':>6} {'CPU s':>7} {'CPU s/GB':>9} {'sys':>4} "
        f"{'minflt':>8} {'vcsw':>7}"
    )
    for cache in ("warm", "cold"):
        for k, r in res[cache].items():
            modes = sorted({(x or {}).get("mode", "?") for x in r.get("read", [])})
            print(
                f"{cache:5} {k:28} {r['median_s']:9.2f} {r['gb_s']:6.2f} {r['cpu_s']:7.2f} "
                f"{r['cpu_s_per_gb']:9.2f} {r['sys_share'] or 0:4.0%} {r['minflt']:8d} {r['vcsw']:7d}"
                + (
                    f"  read: {'/'.join(modes)}, {r['read_direct_share']:.0%} O_DIRECT, "
                    f"probed in {r['probed']} of {len(r['runs_s'])}"
                    + (f", {r['start_s']:.2f} s outside stage()" if "start_s" in r else "")
                    if cache == "cold" and "read" in r
                    else ""
                )
            )
    if res["disk_read_gb_s"]:
        for k, v in res["disk_read_gb_s"].items():
            print(f"disk  {k:34} {v:5.2f} GB/s")
        share = res["cold_cached_share_before_runs_max"]
        print(
            f"disk anchor (best of the above): {res['disk_anchor_gb_s']:.2f} GB/s; cold runs started with at most "
            f"{'?' if share is None else f'{share:.1%}'} of the source's bytes cached"
        )
        beat = [k for k, r in res["cold"].items() if r["gb_s"] > res["disk_anchor_gb_s"]]
        if beat:
            print(
                f"note: {', '.join(beat)} read faster than the anchor's best strategy (within noise, or a better one)"
            )
    for k, v in res.get("fill_ceiling_gb_s", {}).items():
        print(f"fill  {k:38} {v:6.2f} GB/s")
    for k, v in res["ratios"].items():
        print(f"{v:6.2f}  {k}")
    print(
        f"no-op re-stage {res['noop_restage_s']:.2f} s; --verify re-hash {res['verify_s']:.2f} s "
        f"({gb / res['verify_s']:.2f} GB/s)"
    )


# -- paired runs: the 2-core goal --------------------------------------------------------------
def paired(src: Path, shm: Path, total: int, k: int, drop: bool, no_cold: bool) -> dict:
    """K pairs of (cp -r, gpubox) back to back, the order alternating, warm and cold: whole processes
    (interpreter start included) on the CPUs this process may use (taskset from outside)."""
    tl = tools(src, None, {})
    pair = ["cp -r", GPUBOX]
    out: dict = {"bytes": total, "cpus": ncpu(), "pairs": k, "load_before": list(os.getloadavg())}
    for cache in ("warm",) + (() if no_cold else ("cold",)):
        runs: dict[str, list[float]] = {p: [] for p in pair}
        cpu: dict[str, list[float]] = {p: [] for p in pair}
        cached = []
        for i in range(k):
            for name in pair if i % 2 == 0 else pair[::-1]:
                if cache == "warm":
                    warm(src)
                else:
                    cached.append(_cold_run(src, drop))
                dest = shm / "dest"
                r = tl[name](dest)
                runs[name].append(r["s"])
                cpu[name].append(r["cpu"])
                shutil.rmtree(dest)
                log(f"pair {i + 1} {cache}: {name:14} {r['s']:6.2f} s cpu {r['cpu']:5.2f} s")
        ratios = [g / c for g, c in zip(runs[GPUBOX], runs["cp -r"])]
        out[cache] = {
            "runs_s": {p: [round(x, 3) for x in v] for p, v in runs.items()},
            "median_s": {p: round(statistics.median(v), 3) for p, v in runs.items()},
            "cpu_s_median": {p: round(statistics.median(v), 3) for p, v in cpu.items()},
            "median_wall_ratio": round(statistics.median(runs[GPUBOX]) / statistics.median(runs["cp -r"]), 3),
            "median_of_pair_ratios": round(statistics.median(ratios), 3),
            **({"cached_before": [None if x is None else round(x, 4) for x in cached]} if cached else {}),
        }
    out["load_after"] = list(os.getloadavg())
    return out


def print_paired(res: dict) -> None:
    print(
        f"\n{res['pairs']} paired runs, {res['bytes'] / GB:.2f} GB, {res['cpus']} CPUs (whole processes); load "
        f"{res['load_before'][0]:.2f} before, {res['load_after'][0]:.2f} after"
    )
    for cache in ("warm", "cold"):
        if cache not in res:
            continue
        r = res[cache]
        meds = ", ".join(
            f"{p} {v:.2f} s (CPU {r['cpu_s_median'][p]:.2f} s)" for p, v in r["median_s"].items()
        )
        extra = ""
        if r.get("cached_before"):
            extra = f"; at most {max(x or 0 for x in r['cached_before']):.1%} cached before"
        print(f"{cache}: median {meds}{extra}")
        print(
            f"{r['median_wall_ratio']:6.2f}  {cache}: median wall {GPUBOX} / cp -r (goal <= 1.0; median of the "
            f"pair ratios {r['median_of_pair_ratios']:.2f})"
        )


if __name__ == "__main__":
    sys.exit(main())
