"""The probe's bandwidth measurements with torch: pinned host<->device copies, device memory copies,
GPU pair (P2P) copies and NCCL all-reduce over TP sets, each a figure with its trials.

Part of the standalone probe script (hwtune/probe.py): torch is the target's (the server's
venv); one failed measurement (OOM, CUDA error) is recorded and the others still run.
"""

from __future__ import annotations

import statistics
import time

if __package__:
    from .probe_common import MIB, error_text
    from .probe_nvml import reasons_of
else:  # run by path (python3 hwtune/probe.py): the sibling modules sit next to it on sys.path
    from probe_common import MIB, error_text
    from probe_nvml import reasons_of

# Sizes and repetitions: big enough that one timed trial runs well past launch overhead and the
# data is many times the L2 (60 MB on H100/H200), small enough that a probe takes seconds.
SIZES = {
    "full": {
        "h2d_mib": 256,
        "h2d_iters": 20,
        "d2d_mib": 2048,
        "d2d_iters": 20,
        "p2p_mib": 256,
        "p2p_iters": 10,
        "ar_mib": 256,
        "ar_iters": 10,
        "trials": 5,
    },
    "quick": {
        "h2d_mib": 64,
        "h2d_iters": 10,
        "d2d_mib": 512,
        "d2d_iters": 10,
        "p2p_mib": 64,
        "p2p_iters": 5,
        "ar_mib": 64,
        "ar_iters": 5,
        "trials": 3,
    },
}


def torch_section():
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising OSError on a missing .so
        return {"status": "skipped", "reason": f"torch not importable ({error_text(exc)})"}, None
    sec = {
        "status": "ok",
        "version": getattr(torch, "__version__", None),
        "cuda": getattr(torch.version, "cuda", None),
    }
    try:
        if not torch.cuda.is_available():
            sec.update(
                status="skipped", reason="torch sees no CUDA device (torch.cuda.is_available() is False)"
            )
            return sec, None
        sec["device_count"] = torch.cuda.device_count()
        try:
            v = torch.cuda.nccl.version()
            sec["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:
            sec["nccl"] = None
            sec["nccl_error"] = error_text(exc)
    except Exception as exc:
        sec.update(status="failed", reason=f"CUDA init failed: {error_text(exc)}")
        return sec, None
    return sec, torch


def _torch_bdf(torch, i: int) -> str | None:
    p = torch.cuda.get_device_properties(i)
    try:
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except AttributeError:
        return None


def _trials(torch, run_once, trials: int, sync_devices) -> list[float]:
    """Wall seconds of each trial; `run_once` enqueues the copies, we sync around it."""
    out = []
    for _ in range(trials):
        for d in sync_devices:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        run_once()
        for d in sync_devices:
            torch.cuda.synchronize(d)
        out.append(time.perf_counter() - t0)
    return out


def _event_trials(torch, dev: int, run_once, trials: int) -> list[float]:
    """Seconds of each trial, timed with CUDA events on the device's stream (no host jitter)."""
    out = []
    with torch.cuda.device(dev):
        for _ in range(trials):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run_once()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1000.0)
    return out


def _fig(nbytes_per_trial: float, secs: list[float]) -> dict:
    rates = sorted(nbytes_per_trial / s / 1e9 for s in secs if s > 0)
    return {
        "gbps": round(statistics.median(rates), 2),
        "gbps_best": round(rates[-1], 2),
        "gbps_worst": round(rates[0], 2),
        "trials": len(rates),
    }


def _link_now(nv, h):
    if nv is None or h is None:
        return None
    try:
        return {
            "gen": nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "width": nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        }
    except nv.NVMLError:
        return None


def host_copy_probe(torch, dev: int, direction: str, sz: dict, nv=None, h=None) -> dict:
    """Pinned host <-> device copy bandwidth (what model loading and CPU offload ride on)."""
    n = sz["h2d_mib"] * MIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    devbuf = torch.empty(n, dtype=torch.uint8, device=dev)
    src, dst = (host, devbuf) if direction == "h2d" else (devbuf, host)
    iters = sz["h2d_iters"]
    link = {}

    def once():
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        # Read the link while copies are in flight: an idle GPU downtrains its link (power saving).
        if not link:
            link.update(_link_now(nv, h) or {})

    with torch.cuda.device(dev):
        for _ in range(2):  # warm-up
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        secs = _event_trials(torch, dev, once, sz["trials"])
    out = {"name": direction, "gpu": dev, "status": "ok", "bytes": n, "iters": iters, **_fig(n * iters, secs)}
    out["link_under_load"] = link or None
    del host, devbuf
    return out


def device_copy_probe(torch, dev: int, sz: dict, nv=None, h=None) -> dict:
    """Device memory bandwidth with a large on-device copy, counting bytes read plus written
    (the convention of CUDA's bandwidthTest and nvbandwidth's device-local copy)."""
    free, _total = torch.cuda.mem_get_info(dev)
    n = sz["d2d_mib"] * MIB
    while n > 64 * MIB and 2 * n > free * 0.8:
        n //= 2
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    iters = sz["d2d_iters"]
    reasons = {}

    def once():
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        if not reasons and nv is not None and h is not None:  # clock event reasons under load
            try:
                fn = (
                    getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or nv.nvmlDeviceGetCurrentClocksThrottleReasons
                )
                reasons.update(reasons_of(fn(h)))
            except nv.NVMLError:
                pass

    with torch.cuda.device(dev):
        for _ in range(2):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        secs = _event_trials(torch, dev, once, sz["trials"])
    out = {
        "name": "d2d",
        "gpu": dev,
        "status": "ok",
        "bytes": n,
        "iters": iters,
        "counting": "read+write",
        **_fig(2 * n * iters, secs),
    }
    out["clock_event_reasons_under_load"] = reasons or None
    src = dst = None  # drop the buffers (a `del` would unbind names the closure reads)
    return out


def p2p_probe(torch, a: int, b: int, sz: dict) -> dict:
    """GPU a -> GPU b copy. Without peer access the copy is staged through host memory, slowly;
    that is reported (peer_access false) rather than hidden."""
    n = sz["p2p_mib"] * MIB
    peer = bool(torch.cuda.can_device_access_peer(a, b))
    src = torch.empty(n, dtype=torch.uint8, device=a)
    dst = torch.empty(n, dtype=torch.uint8, device=b)
    iters = sz["p2p_iters"]

    def once():
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)

    once()
    secs = _trials(torch, once, sz["trials"], (a, b))
    src = dst = None  # drop the buffers (a `del` would unbind names the closure reads)
    return {
        "name": "p2p",
        "src": a,
        "dst": b,
        "status": "ok",
        "peer_access": peer,
        "bytes": n,
        "iters": iters,
        **_fig(n * iters, secs),
    }


def _ar_iters(sz: dict, nbytes: int) -> int:
    """Small all-reduces need more repetitions to outlast launch overhead: scale the iteration
    count with the ratio to the default size, capped so that a trial stays short."""
    base = sz["ar_mib"] * MIB
    return int(min(200, max(sz["ar_iters"], sz["ar_iters"] * base // max(nbytes, 1))))


def allreduce_probe(torch, devs: list[int], sz: dict, nbytes: int | None = None) -> dict:
    """NCCL all-reduce over a TP GPU set; busbw = algbw * 2(n-1)/n (nccl-tests' definition).

    One process drives all GPUs through torch.cuda.nccl (ncclCommInitAll, as nccl-tests' -g mode)
    rather than torch.multiprocessing.spawn: spawn must re-import __main__, which a payload
    served from memory (gpubox.transport.payload) does not have as a file."""
    from torch.cuda import nccl

    n = len(devs)
    elems = max(1, (nbytes or sz["ar_mib"] * MIB) // 4)
    ts = [torch.ones(elems, dtype=torch.float32, device=d) for d in devs]
    if not nccl.is_available(ts):
        return {
            "name": "allreduce",
            "gpus": devs,
            "status": "skipped",
            "reason": "torch.cuda.nccl is not available for these tensors",
        }
    nccl.all_reduce(ts)
    for d in devs:
        torch.cuda.synchronize(d)
    got = [float(t[0].item()) for t in ts]
    if any(abs(g - n) > 1e-3 for g in got):
        return {
            "name": "allreduce",
            "gpus": devs,
            "status": "failed",
            "reason": f"wrong sum: expected {n}, got {got}",
        }
    for t in ts:
        t.zero_()
    iters = sz["ar_iters"] if nbytes is None else _ar_iters(sz, elems * 4)

    def once():
        for _ in range(iters):
            nccl.all_reduce(ts)

    once()
    secs = _trials(torch, once, sz["trials"], devs)
    nbytes = elems * 4
    fig = _fig(nbytes * iters, secs)  # algbw: bytes of the buffer / time per all-reduce
    factor = 2 * (n - 1) / n
    return {
        "name": "allreduce",
        "gpus": devs,
        "status": "ok",
        "bytes": nbytes,
        "iters": iters,
        "algbw_gbps": fig["gbps"],
        "busbw_gbps": round(fig["gbps"] * factor, 2),
        "busbw_factor": round(factor, 4),
        "trials": fig["trials"],
    }


def _safe(fn, base: dict, *args, **kw) -> dict:
    try:
        return fn(*args, **kw)
    except Exception as exc:  # one failed probe (OOM, CUDA error) must not stop the others
        return {**base, "status": "failed", "reason": error_text(exc)}


def bandwidth_section(
    torch,
    nv,
    handles: dict,
    *,
    quick: bool,
    p2p: bool,
    allreduce_sets,
    p2p_pairs=None,
    copies: bool = True,
    allreduce_bytes=None,
) -> dict:
    sz = SIZES["quick" if quick else "full"]
    n = torch.cuda.device_count()
    probes = []
    for i in range(n) if copies else ():
        bdf = _torch_bdf(torch, i)
        h = handles.get(bdf)
        for direction in ("h2d", "d2h"):
            r = _safe(host_copy_probe, {"name": direction, "gpu": i}, torch, i, direction, sz, nv, h)
            r["bus_id"] = bdf
            probes.append(r)
        r = _safe(device_copy_probe, {"name": "d2d", "gpu": i}, torch, i, sz, nv, h)
        r["bus_id"] = bdf
        probes.append(r)
    if p2p:
        # Every ordered pair by default; explicit pairs may name one GPU twice ("0-0"), which
        # exercises this code on a one-GPU machine (a same-device copy, not judged as P2P).
        pairs = p2p_pairs if p2p_pairs is not None else [(a, b) for a in range(n) for b in range(n) if a != b]
        for a, b in pairs:
            base = {"name": "p2p", "src": a, "dst": b}
            if not (0 <= a < n and 0 <= b < n):
                probes.append({**base, "status": "skipped", "reason": f"GPU index not present ({n} visible)"})
                continue
            probes.append(_safe(p2p_probe, base, torch, a, b, sz))
    sets = allreduce_sets if allreduce_sets is not None else default_sets(n)
    for devs in sets:
        bad = [d for d in devs if d >= n or d < 0]
        if bad:
            probes.append(
                {
                    "name": "allreduce",
                    "gpus": devs,
                    "status": "skipped",
                    "reason": f"GPU index {bad} not present ({n} visible)",
                }
            )
            continue
        for nb in allreduce_bytes or [None]:
            base = {"name": "allreduce", "gpus": devs, **({"bytes": nb} if nb else {})}
            probes.append(_safe(allreduce_probe, base, torch, devs, sz, nb))
    return {
        "status": "ok",
        "mode": "quick" if quick else "full",
        "devices": n,
        "gpu_bus_ids": [_torch_bdf(torch, i) for i in range(n)],
        "probes": probes,
    }


def default_sets(n: int) -> list[list[int]]:
    """TP sets of the usual sizes 2, 4, 8 that fit: contiguous groups (TP4 on 8 GPUs: 0-3 and 4-7)."""
    out = []
    for tp in (2, 4, 8):
        if tp <= n:
            out.extend(list(range(s, s + tp)) for s in range(0, n - tp + 1, tp))
    return out
