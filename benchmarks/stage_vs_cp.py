#!/usr/bin/env python3
"""Staging a model into tmpfs: `gpubox stage` (hash-verified) vs what an admin would run, warm and cold.

Generates a model-like directory on disk (safetensors shards of varying size + config/tokenizer files,
fsync'd), then in every round, alternating the tools so drift hits all alike:

  warm  (the whole source read before each run):
        cp -r SRC DEST | xargs -0 -P N -n 1 cp -t DEST (parallel per-file cp, N = CPUs) | rsync -a
        (skipped where not installed) | gpubox crc32 | gpubox sha256 [| gpubox before: --before FILE]
  cold  (each source file's pages evicted with posix_fadvise(POSIX_FADV_DONTNEED) before each run:
        per file, no /proc/sys/vm/drop_caches, nothing global is touched):
        the source device's own sequential read rate (O_DIRECT reads of the same files, 1 stream and
        one stream per file, 4 MiB; fio too when installed) | cp -r | xargs cp | gpubox crc32 | sha256

Residency is checked, not assumed: after the eviction, preadv2(RWF_NOWAIT) probes 64 offsets per file
and the share found cached is printed ("cold: 0% cached"). gpubox is run as `python3
provision/stage.py SRC DEST` (the stdlib-only engine `gpubox stage SRC DEST` calls in-process), so
the benchmark needs nothing but the stdlib; no-op re-stage and --verify are timed at the end.

    python benchmarks/stage_vs_cp.py                       # 4 GB, 3 rounds
    python benchmarks/stage_vs_cp.py --size 16 --rounds 3 --json-out res.json

Ratios (goals of issue 21): warm gpubox crc32 / xargs cp <= 1 (16+ cores) and / cp -r <= 1 (2 cores);
cold gpubox rate / device read rate >= 0.9; gpubox CPU-s per GB / cp -r's <= 3. CPU seconds, minor
faults and context switches are the children's rusage (xargs's cp children included).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
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
ENGINE = ROOT / "provision" / "stage.py"
GB = 1e9
DIRECT_BLOCK = 4 << 20


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


def generate(src: Path, total_gb: float) -> int:
    src.mkdir(parents=True)
    sizes = shard_sizes(total_gb)
    block, counter = bytearray(os.urandom(16 << 20)), [0]
    n, weight_map = len(sizes), {}
    for i, size in enumerate(sizes):
        rel, t = f"model-{i + 1:05d}-of-{n:05d}.safetensors", f"model.layers.{i}.weight"
        _shard(src / rel, size, t, block, counter)
        weight_map[t] = rel
    docs = {
        "config.json": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "torch_dtype": "bfloat16",
        },
        "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}},
        "tokenizer_config.json": {"tokenizer_class": "Qwen2Tokenizer"},
        "model.safetensors.index.json": {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map},
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


def evict(src: Path) -> None:
    """Drop this source's pages only (its files are clean: fsync'd when written)."""
    for p in source_files(src):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_share(src: Path, probes: int = 64) -> float | None:
    """Share of probe offsets whose page is in the page cache (preadv2 RWF_NOWAIT fails with EAGAIN
    when a read would have to wait for the device); None where the kernel lacks it."""
    if not hasattr(os, "RWF_NOWAIT"):
        return None
    buf, hit, total = bytearray(4096), 0, 0
    for p in source_files(src):
        size = p.stat().st_size
        fd = os.open(p, os.O_RDONLY)
        try:
            for k in range(probes if size > probes * 4096 else 1):
                total += 1
                try:
                    os.preadv(fd, [buf], (size * k // probes) // 4096 * 4096, os.RWF_NOWAIT)
                    hit += 1
                except BlockingIOError:
                    pass
                except OSError:
                    return None
        finally:
            os.close(fd)
    return hit / total if total else None


def direct_read(src: Path, parallel: bool) -> tuple[float, float] | None:
    """(seconds, CPU-s) to read every source file with O_DIRECT (the device, no page cache): one
    stream, or one thread per file; None where O_DIRECT is refused."""
    files = source_files(src)
    failed: list[Exception] = []

    def read(p: Path) -> None:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
        except OSError as exc:
            failed.append(exc)
            return
        buf = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT requires
        try:
            off = 0
            while True:
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    break
                off += n
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(fd)
            buf.close()

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if parallel:
        ts = [threading.Thread(target=read, args=(p,)) for p in files]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        for p in files:
            read(p)
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return None if failed else (dt, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)


def fio_read(src: Path) -> float | None:
    """fio's sequential O_DIRECT read of the biggest source file in GB/s, when fio is installed."""
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
            "--bs=1M",
            "--direct=1",
            "--ioengine=psync",
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
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "vcsw": r1.ru_nvcsw - r0.ru_nvcsw,
        "ivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
        "out": r.stdout,
    }


def tools(src: Path, before: str | None) -> dict:
    """name -> run(dest) -> rusage dict; cp-like tools first (the anchors), then gpubox."""
    n = os.cpu_count() or 2
    listing = b"\0".join(str(p).encode() for p in source_files(src))

    def xargs_cp(d: Path) -> dict:
        d.mkdir()
        return timed(["xargs", "-0", "-P", str(n), "-n", "1", "cp", "-t", str(d)], stdin=listing)

    out = {"cp -r": lambda d: timed(["cp", "-r", str(src), str(d)])}
    if shutil.which("xargs"):
        out[f"xargs -P{n} cp"] = xargs_cp
    if shutil.which("rsync"):
        out["rsync -a"] = lambda d: timed(["rsync", "-a", f"{src}/", f"{d}/"])
    out["gpubox crc32"] = lambda d: timed([sys.executable, str(ENGINE), str(src), str(d)])
    out["gpubox sha256"] = lambda d: timed(
        [sys.executable, str(ENGINE), str(src), str(d), "--hash", "sha256"]
    )
    if os.environ.get("BENCH_BUF_KIB"):  # a slice-size variant of the same engine (provision/stage.py BUF)
        kib = os.environ["BENCH_BUF_KIB"]
        out[f"gpubox crc32 {kib}K slice"] = lambda d: timed(
            [sys.executable, str(ENGINE), str(src), str(d)], env={**os.environ, "GPUBOX_STAGE_BUF_KIB": kib}
        )
    if before:
        out["gpubox before (crc32)"] = lambda d: timed([sys.executable, before, str(src), str(d)])
    return out


# -- the run ---------------------------------------------------------------------------------
def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=4.0, help="model size in GB (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument(
        "--workdir", default=None, help="disk directory for the source (default: a temp dir in /var/tmp)"
    )
    ap.add_argument("--tmpfs", default="/dev/shm", help="tmpfs directory to stage into (default /dev/shm)")
    ap.add_argument("--no-cold", action="store_true", help="warm runs only")
    ap.add_argument("--before", help="an earlier provision/stage.py to time beside (warm; from git show)")
    ap.add_argument("--budget", type=float, default=0, help="seconds: no new round after this (0: none)")
    ap.add_argument("--json-out", help="also write the figures as JSON to this file")
    args = ap.parse_args()

    t_start = time.perf_counter()
    need = args.size * GB * 1.15
    if shutil.disk_usage(args.tmpfs).free < need:
        raise SystemExit(
            f"{args.tmpfs} has {shutil.disk_usage(args.tmpfs).free / GB:.1f} GB free, needs "
            f"{need / GB:.1f} GB: use --size smaller"
        )
    work = Path(tempfile.mkdtemp(prefix="gpubox-bench-", dir=args.workdir or "/var/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="gpubox-bench-", dir=args.tmpfs))
    src = work / "Model"
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    res: dict = {}
    try:
        t0 = time.perf_counter()
        total = generate(src, args.size)
        nfiles = len(source_files(src))
        log(f"generated {src}: {nfiles} files, {total / GB:.2f} GB in {time.perf_counter() - t0:.1f} s")
        tl = tools(src, args.before)
        warm_runs: dict[str, list[dict]] = {k: [] for k in tl}
        cold_runs: dict[str, list[dict]] = {
            k: [] for k in tl if "before" not in k and "slice" not in k and k != "rsync -a"
        }
        device: dict[str, list[float]] = {"1 stream": [], "stream per file": []}
        cached: list[float] = []
        load0 = os.getloadavg()
        log(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
        for rnd in range(args.rounds):
            if rnd and args.budget and time.perf_counter() - t_start > args.budget:
                log(f"budget of {args.budget:.0f} s spent: {rnd} round(s)")
                break
            names = list(tl)
            for name in (
                names[rnd % len(names) :] + names[: rnd % len(names)]
            ):  # rotated: no tool always first
                run = tl[name]
                dest = shm / "dest"
                warm(src)
                r = run(dest)
                warm_runs[name].append(r)
                log(
                    f"round {rnd + 1} warm: {name:24} {r['s']:6.2f} s {total / r['s'] / GB:5.2f} GB/s "
                    f"cpu {r['cpu']:6.2f} s"
                )
                shutil.rmtree(dest)
            if args.no_cold:
                continue
            for mode, par in (("1 stream", False), ("stream per file", True)):
                evict(src)
                d = direct_read(src, par)
                if d is not None:
                    device[mode].append(total / d[0] / GB)
                    log(
                        f"round {rnd + 1} cold: O_DIRECT {mode:15} {d[0]:6.2f} s "
                        f"{total / d[0] / GB:5.2f} GB/s"
                    )
            names = list(cold_runs)
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                dest = shm / "dest"
                evict(src)
                share = cached_share(src)
                if share is not None:
                    cached.append(share)
                r = tl[name](dest)
                if name.startswith("gpubox"):  # how much of the source it read with O_DIRECT
                    r["direct"] = json.loads(r["out"]).get("read_direct_bytes", 0) / total
                cold_runs[name].append(r)
                log(
                    f"round {rnd + 1} cold: {name:24} {r['s']:6.2f} s {total / r['s'] / GB:5.2f} GB/s "
                    f"cpu {r['cpu']:6.2f} s (cached before: {share if share is None else f'{share:.0%}'})"
                )
                shutil.rmtree(dest)
        load1 = os.getloadavg()
        # a final staged copy: the no-op re-stage and --verify
        dest = shm / "dest"
        timed([sys.executable, str(ENGINE), str(src), str(dest)])
        noop = timed([sys.executable, str(ENGINE), str(src), str(dest)])
        assert json.loads(noop["out"])["copied"] == 0
        ver = timed([sys.executable, str(ENGINE), str(src), str(dest), "--verify"])
        assert json.loads(ver["out"])["verified"] == nfiles
        fio = None if args.no_cold else fio_read(src)
        res = summarise(total, nfiles, warm_runs, cold_runs, device, cached, fio, load0, load1, noop, ver)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n")
    print_table(res)
    return 0


def summarise(total, nfiles, warm_runs, cold_runs, device, cached, fio, load0, load1, noop, ver) -> dict:
    gb = total / GB

    def rows(runs):
        return {
            k: {
                "median_s": round(med(v, "s"), 3),
                "gb_s": round(gb / med(v, "s"), 3),
                "cpu_s": round(med(v, "cpu"), 3),
                "cpu_s_per_gb": round(med(v, "cpu") / gb, 3),
                "minflt": int(med(v, "minflt")),
                "vcsw": int(med(v, "vcsw")),
                "ivcsw": int(med(v, "ivcsw")),
                "runs_s": [round(r["s"], 3) for r in v],
                **({"read_direct_share": round(med(v, "direct"), 3)} if "direct" in v[0] else {}),
            }
            for k, v in runs.items()
            if v
        }

    w, c = rows(warm_runs), rows(cold_runs)
    xa = next((k for k in w if k.startswith("xargs")), "cp -r")  # without xargs: against cp -r
    dev = {k: round(statistics.median(v), 3) for k, v in device.items() if v}
    if fio:
        dev["fio 1 stream"] = round(fio, 3)
    dev_rate = max(dev.values()) if dev else None

    def wall(a, b, rows=w):
        return rows[a]["median_s"] / rows[b]["median_s"]

    def cpu(a, b, rows=w):
        return rows[a]["cpu_s"] / rows[b]["cpu_s"]

    ratios = {
        "warm: gpubox crc32 / xargs cp (wall; goal <= 1 on 16+ cores)": wall("gpubox crc32", xa),
        "warm: gpubox sha256 / xargs cp (wall)": wall("gpubox sha256", xa),
        "warm: gpubox crc32 / cp -r (wall; goal <= 1 on 2 cores)": wall("gpubox crc32", "cp -r"),
        "warm: gpubox sha256 / cp -r (wall)": wall("gpubox sha256", "cp -r"),
        "warm: gpubox crc32 CPU/GB / cp -r's (goal <= 3)": cpu("gpubox crc32", "cp -r"),
        "warm: gpubox sha256 CPU/GB / cp -r's (goal <= 3)": cpu("gpubox sha256", "cp -r"),
    }
    if "gpubox before (crc32)" in w:
        ratios["warm: gpubox before / xargs cp (wall)"] = wall("gpubox before (crc32)", xa)
        ratios["warm: gpubox before CPU/GB / cp -r's"] = cpu("gpubox before (crc32)", "cp -r")
    if c and dev_rate:
        for k in dict.fromkeys(("gpubox crc32", "gpubox sha256", "cp -r", xa)):
            ratios[f"cold: {k} rate / device read rate (goal >= 0.9 for gpubox)"] = c[k]["gb_s"] / dev_rate
        ratios["cold: gpubox crc32 CPU/GB / cp -r's (goal <= 3)"] = cpu("gpubox crc32", "cp -r", c)
    return {
        "bytes": total,
        "files": nfiles,
        "cpus": os.cpu_count(),
        "rounds": len(next(iter(warm_runs.values()))),
        "warm": w,
        "cold": c,
        "device_read_gb_s": dev,
        "device_rate_gb_s": dev_rate,
        "cold_cached_share_before_runs": round(max(cached), 3) if cached else None,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "noop_restage_s": round(noop["s"], 3),
        "verify_s": round(ver["s"], 3),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
    }


def print_table(res: dict) -> None:
    gb = res["bytes"] / GB
    print(
        f"\n{res['files']} files, {gb:.2f} GB, disk -> tmpfs, {res['rounds']} round(s), "
        f"{res['cpus']} CPUs; "
        f"load average {res['load_before'][0]:.2f} before, {res['load_after'][0]:.2f} after"
    )
    hdr = (
        f"{'cache':5} {'tool':24} {'median s':>9} {'GB/s':>6} {'CPU s':>7} {'CPU s/GB':>9} "
        f"{'minflt':>8} {'vcsw':>7}"
    )
    print(hdr)
    for cache in ("warm", "cold"):
        for k, r in res[cache].items():
            print(
                f"{cache:5} {k:24} {r['median_s']:9.2f} {r['gb_s']:6.2f} {r['cpu_s']:7.2f} "
                f"{r['cpu_s_per_gb']:9.2f} "
                f"{r['minflt']:8d} {r['vcsw']:7d}"
                + (f"  read {r['read_direct_share']:.0%} with O_DIRECT" if "read_direct_share" in r else "")
            )
    if res["device_read_gb_s"]:
        dev = ", ".join(f"{k} {v:.2f}" for k, v in res["device_read_gb_s"].items())
        share = res["cold_cached_share_before_runs"]
        print(
            f"source device, O_DIRECT sequential read GB/s: {dev} "
            f"(rate used: {res['device_rate_gb_s']:.2f}); "
            f"cold runs started with {'?' if share is None else f'{share:.0%}'} of probed pages cached"
        )
    for k, v in res["ratios"].items():
        print(f"{v:6.2f}  {k}")
    print(
        f"no-op re-stage {res['noop_restage_s']:.2f} s; --verify re-hash {res['verify_s']:.2f} s "
        f"({gb / res['verify_s']:.2f} GB/s)"
    )


if __name__ == "__main__":
    sys.exit(main())
