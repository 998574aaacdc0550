#!/usr/bin/env python3
"""GPU health probe: NVML facts and copy-bandwidth measurements, printed as one JSON document.

Runs standalone on the target: gpubox runs this module as a payload (gpubox.transport.payload) with
`python3 [options]` in the container
(the server's venv has torch; gpubox need not be installed there), so it imports only the standard
library plus pynvml (nvidia-ml-py) and torch when they are importable. It measures and reports;
judging the figures against limits is gpubox's job (hwtune/probe_verdict.py), so the verdict code
is tested in CI on output recorded from a real GPU.

Every section is independent and ends as {"status": "ok" | "skipped" | "failed", "reason": ...}:
no NVML, no GPU or no torch makes a section "skipped" with the missing piece named, never a crash.
The probe is read-only: it changes no clock, MIG, persistence or PCIe setting.

    python3 hwtune/probe.py [--quick] [--no-bandwidth] [--no-p2p] [--p2p-pairs 0-1,0-4]
                            [--allreduce-sets "0,1,2,3;4,5,6,7"] [--no-copies]
                            [--allreduce-bytes 1048576,268435456]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

SCHEMA = "gpubox.probe/1"
MIB = 1 << 20

# NVML clock event ("throttle") reason bits, nvml.h nvmlClocksEventReason*; named here so the
# JSON carries names even when an older pynvml lacks a constant.
CLOCK_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

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


def _s(v):
    """pynvml returns bytes in old releases and str in new ones."""
    return v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else v


def norm_bdf(bus_id: str) -> str:
    """'00000000:17:00.0' (NVML) or '0000:17:00.0' (sysfs) -> '0000:17:00.0'."""
    bus_id = _s(bus_id).strip().lower()
    parts = bus_id.split(":")
    if len(parts) != 3:
        return bus_id
    dom, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16)}"


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


# -- NVML ---------------------------------------------------------------------------------------
class _Fields:
    """Reads NVML fields one by one; a field the GPU or driver does not support is recorded in
    `unsupported`, not fatal (NVML answers NOT_SUPPORTED for e.g. page retirement on Hopper)."""

    def __init__(self, nv):
        self.nv = nv
        self.unsupported: dict[str, str] = {}

    def get(self, name, fn, *args):
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            self.unsupported[name] = str(exc)
        except (AttributeError, TypeError) as exc:  # function missing in this pynvml release
            self.unsupported[name] = _err(exc)
        return None


def _reasons(mask):
    if mask is None:
        return None
    return {"mask": int(mask), "active": [n for bit, n in sorted(CLOCK_REASONS.items()) if mask & bit]}


def _clock_reasons(nv, h, f: _Fields):
    fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return _reasons(f.get("clock_event_reasons", fn, h))


def gpu_facts(nv, h, index: int) -> dict:
    """Everything NVML tells about one GPU that bears on its health and its links."""
    f = _Fields(nv)
    g: dict = {"index": index}
    g["name"] = _s(f.get("name", nv.nvmlDeviceGetName, h))
    g["uuid"] = _s(f.get("uuid", nv.nvmlDeviceGetUUID, h))
    pci = f.get("pci", nv.nvmlDeviceGetPciInfo, h)
    g["bus_id"] = norm_bdf(pci.busId) if pci is not None else None
    g["pci_device_id"] = f"0x{pci.pciDeviceId:08x}" if pci is not None else None
    cc = f.get("compute_capability", nv.nvmlDeviceGetCudaComputeCapability, h)
    g["compute_capability"] = f"{cc[0]}.{cc[1]}" if cc else None
    mem = f.get("memory", nv.nvmlDeviceGetMemoryInfo, h)
    g["memory_total_mib"] = mem.total // MIB if mem is not None else None
    g["memory_used_mib"] = mem.used // MIB if mem is not None else None
    pm = f.get("persistence_mode", nv.nvmlDeviceGetPersistenceMode, h)
    g["persistence_mode"] = None if pm is None else bool(pm)
    mig = f.get("mig_mode", nv.nvmlDeviceGetMigMode, h)
    g["mig_mode"] = None if mig is None else {"current": int(mig[0]), "pending": int(mig[1])}
    # Current gen drops at idle (ASPM / power saving), so the verdict also looks at the link read
    # under load during the H2D probe. MaxPcieLinkGeneration is the GPU *and system* limit,
    # GpuMaxPcieLinkGeneration the GPU's own: a gap between them is a slot/BIOS limit.
    g["pcie"] = {
        "gen_current": f.get("pcie_gen_current", nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "gen_max": f.get("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "gen_gpu_max": f.get(
            "pcie_gen_gpu_max", getattr(nv, "nvmlDeviceGetGpuMaxPcieLinkGeneration", None), h
        ),
        "width_current": f.get("pcie_width_current", nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        "width_max": f.get("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        "replay_counter": f.get("pcie_replay_counter", nv.nvmlDeviceGetPcieReplayCounter, h),
    }
    ecc = f.get("ecc_mode", nv.nvmlDeviceGetEccMode, h)
    g["ecc"] = {
        "enabled": None if ecc is None else bool(ecc[0]),
        "volatile_uncorrected": f.get(
            "ecc_volatile_uncorrected",
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        ),
        "aggregate_uncorrected": f.get(
            "ecc_aggregate_uncorrected",
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_AGGREGATE_ECC,
        ),
        "volatile_corrected": f.get(
            "ecc_volatile_corrected",
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nv.NVML_VOLATILE_ECC,
        ),
    }
    # Page retirement (pre-Ampere) and row remapping (A100 and later): "pending" means a reset is
    # needed to take the bad memory out of use; a remap "failure" means the GPU ran out of spare rows.
    sbe = f.get(
        "retired_pages_sbe",
        nv.nvmlDeviceGetRetiredPages,
        h,
        nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    dbe = f.get(
        "retired_pages_dbe",
        nv.nvmlDeviceGetRetiredPages,
        h,
        nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    pend = f.get("retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    g["retired_pages"] = (
        None
        if sbe is None and dbe is None and pend is None
        else {
            "sbe": None if sbe is None else len(sbe),
            "dbe": None if dbe is None else len(dbe),
            "pending": None if pend is None else bool(pend),
        }
    )
    rr = f.get("remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
    g["remapped_rows"] = (
        None
        if rr is None
        else {
            "correctable": int(rr[0]),
            "uncorrectable": int(rr[1]),
            "pending": bool(rr[2]),
            "failure": bool(rr[3]),
        }
    )
    g["clock_event_reasons"] = _clock_reasons(nv, h, f)
    g["clocks_mhz"] = {
        "sm": f.get("clock_sm", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        "mem": f.get("clock_mem", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        "sm_max": f.get("clock_sm_max", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        "mem_max": f.get("clock_mem_max", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
    }
    g["temperature_c"] = f.get("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
    pw = f.get("power", nv.nvmlDeviceGetPowerUsage, h)
    g["power_w"] = None if pw is None else round(pw / 1000.0, 1)
    pl = f.get("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
    g["power_limit_w"] = None if pl is None else round(pl / 1000.0, 1)
    pd = f.get("power_default", nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
    g["power_default_w"] = None if pd is None else round(pd / 1000.0, 1)
    g["fabric"] = fabric_facts(nv, h, f)
    g["app_clocks_mhz"] = {
        "sm": f.get("app_clock_sm", nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_SM),
        "sm_default": f.get(
            "app_clock_sm_default", nv.nvmlDeviceGetDefaultApplicationsClock, h, nv.NVML_CLOCK_SM
        ),
        "mem": f.get("app_clock_mem", nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_MEM),
        "mem_default": f.get(
            "app_clock_mem_default", nv.nvmlDeviceGetDefaultApplicationsClock, h, nv.NVML_CLOCK_MEM
        ),
    }
    g["numa"] = numa_facts(nv, h, g["bus_id"], f)
    g["nvlink"] = nvlink_facts(nv, h, f)
    g["unsupported"] = f.unsupported
    return g


FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def fabric_facts(nv, h, f: _Fields) -> dict | None:
    """NVSwitch fabric registration (nvml.h nvmlDeviceGetGpuFabricInfoV): on HGX boxes the fabric
    manager must have finished (state completed, status success) before CUDA can start (else
    cuInit 802). A GPU without an NVSwitch fabric says not_supported: nothing to judge."""
    info = None
    cls = getattr(nv, "c_nvmlGpuFabricInfo_v2_t", None)
    if cls is not None and hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
        info = cls()
        if f.get("fabric", nv.nvmlDeviceGetGpuFabricInfoV, h, nv.byref(info)) is None:
            info = None
    if info is None and hasattr(nv, "c_nvmlGpuFabricInfo_t"):
        info = nv.c_nvmlGpuFabricInfo_t()
        if f.get("fabric_v1", nv.nvmlDeviceGetGpuFabricInfo, h, nv.byref(info)) is None:
            return None
    if info is None:
        return None
    state = int(info.state)
    return {
        "state": FABRIC_STATES.get(state, str(state)),
        "status": int(info.status),
        "clique": int(info.cliqueId),
        "health_mask": int(getattr(info, "healthMask", 0)),
    }


_FI_NVLINK_SPEED_COMMON = 90  # nvml.h NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
_FI_NVLINK_GET_SPEED = 164  # nvml.h NVML_FI_DEV_NVLINK_GET_SPEED (per link, scopeId = link)


def nvlink_facts(nv, h, f: _Fields) -> dict | None:
    """Every NVLink of the GPU: state, version, remote PCI bus id (a GPU, or an NVSwitch), and the
    common per-link speed. None when the GPU has no NVLink (NVML answers NotSupported on link 0)."""
    links = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except Exception:  # NotSupported / InvalidArgument: past the last link, or no NVLink
            break
        rec = {"link": link, "active": bool(state)}
        for key, fn in (
            ("version", "nvmlDeviceGetNvLinkVersion"),
            ("remote", "nvmlDeviceGetNvLinkRemotePciInfo"),
        ):
            try:
                v = getattr(nv, fn)(h, link)
                rec[key] = norm_bdf(v.busId) if key == "remote" else int(v)
            except Exception:
                rec[key] = None
        try:
            rtype = nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
            rec["remote_type"] = {0: "gpu", 1: "ibmnpu", 2: "switch"}.get(int(rtype), str(rtype))
        except Exception:
            pass
        links.append(rec)
    if not links:
        return None
    speed = None
    try:
        fv = nv.nvmlDeviceGetFieldValues(
            h, [getattr(nv, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", _FI_NVLINK_SPEED_COMMON)]
        )
        ret = int(getattr(fv[0], "nvmlReturn", 0)) if fv else None
        if ret == 0:
            val = fv[0].value
            speed = int(getattr(val, "uiVal", 0) or getattr(val, "ullVal", 0) or 0) or None
        else:
            f.unsupported["nvlink_speed"] = f"field value return {ret}"
    except Exception as exc:
        f.unsupported["nvlink_speed"] = _err(exc)
    if speed is None:  # newer drivers: per-link NVML_FI_DEV_NVLINK_GET_SPEED (164), scope = link
        try:
            fv = nv.nvmlDeviceGetFieldValues(h, [(_FI_NVLINK_GET_SPEED, r["link"]) for r in links])
            for r, v in zip(links, fv):
                if int(getattr(v, "nvmlReturn", 1)) == 0:
                    r["speed_mbps"] = (
                        int(getattr(v.value, "uiVal", 0) or getattr(v.value, "ullVal", 0) or 0) or None
                    )
            got = sorted(r["speed_mbps"] for r in links if r.get("active") and r.get("speed_mbps"))
            speed = got[0] if got else None  # the slowest active link: what a pair can count on
        except Exception as exc:
            f.unsupported["nvlink_speed_per_link"] = _err(exc)
    return {"links": links, "active": sum(1 for r in links if r["active"]), "speed_mbps_common": speed}


def _cpus_to_node(cpus: set[int], sysroot: str = "/sys/devices/system/node") -> int | None:
    """The NUMA node whose cpulist holds all `cpus` (None when they span nodes or nothing is known)."""
    found = set()
    try:
        names = [n for n in os.listdir(sysroot) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return None
    for n in names:
        try:
            with open(f"{sysroot}/{n}/cpulist") as fh:
                node_cpus = _parse_cpulist(fh.read())
        except OSError:
            continue
        if cpus & node_cpus:
            found.add(int(n[4:]))
    return found.pop() if len(found) == 1 else None


def _parse_cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            out.update(range(int(a), int(b or a) + 1))
    return out


def numa_facts(nv, h, bus_id, f: _Fields) -> dict:
    """The GPU's NUMA node and where it came from: NVML, sysfs numa_node, else the CPU affinity NVML
    reports mapped to nodes (numa_node is -1 in VMs: unknown, never node 0; docs/facts.md)."""
    fn = getattr(nv, "nvmlDeviceGetNumaNodeId", None)
    if fn is not None:
        try:
            v = int(fn(h))
            if v >= 0:
                return {"node": v, "source": "nvml"}
        except Exception:
            pass
    if bus_id:
        try:
            with open(f"/sys/bus/pci/devices/{bus_id}/numa_node") as fh:
                v = int(fh.read().strip())
            if v >= 0:
                return {"node": v, "source": "sysfs"}
        except (OSError, ValueError):
            pass
    try:
        words = nv.nvmlDeviceGetCpuAffinity(h, 16)
        cpus = {w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1}
        node = _cpus_to_node(cpus) if cpus else None
        if node is not None:
            return {"node": node, "source": "cpu_affinity"}
    except Exception:
        pass
    return {"node": None, "source": None}


def _kernel_module_version() -> str | None:
    """The loaded kernel module's version, for comparison with NVML's userspace driver version."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            line = fh.readline()
    except OSError:
        return None
    for tok in line.split():
        if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
            return tok
    return None


def nvml_section():
    """(section dict, pynvml module or None, handles by bus id)."""
    try:
        import pynvml as nv
    except ImportError as exc:
        # the true reason, with the interpreter that failed: the probe runs with the container's
        # python, which may not be the one that has nvidia-ml-py
        why = f"pynvml not importable by {sys.executable} ({type(exc).__name__}: {exc})"
        if getattr(exc, "name", None) == "pynvml":
            why += "; install nvidia-ml-py where that python finds it (under PEP 668: in a venv)"
        return {"status": "skipped", "reason": why}, None, {}
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        text = str(exc)
        if "Library Not Found" in text or "LibraryNotFound" in type(exc).__name__:
            why = "no NVML: libnvidia-ml.so not found (no NVIDIA driver on this machine)"
        elif "Driver Not Loaded" in text:
            why = "no NVML: the NVIDIA kernel driver is not loaded"
        else:
            why = f"no NVML: nvmlInit failed: {text}"
        return {"status": "skipped", "reason": why}, None, {}
    sec: dict = {"status": "ok"}
    f = _Fields(nv)
    sec["driver"] = _s(f.get("driver", nv.nvmlSystemGetDriverVersion))
    cuda = f.get(
        "cuda_driver",
        getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None) or nv.nvmlSystemGetCudaDriverVersion,
    )
    sec["cuda_driver"] = None if cuda is None else f"{cuda // 1000}.{(cuda % 1000) // 10}"
    sec["nvml"] = _s(f.get("nvml", nv.nvmlSystemGetNVMLVersion))
    sec["kernel_module"] = _kernel_module_version()
    count = f.get("count", nv.nvmlDeviceGetCount) or 0
    gpus, handles = [], {}
    for i in range(count):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:  # e.g. a GPU that fell off the bus (XID 79) answers GPU_IS_LOST
            gpus.append({"index": i, "error": str(exc)})
            continue
        g = gpu_facts(nv, h, i)
        gpus.append(g)
        if g.get("bus_id"):
            handles[g["bus_id"]] = h
    sec["gpus"] = gpus
    sec["unsupported"] = f.unsupported
    if not gpus:
        sec.update(status="skipped", reason="no GPU: NVML sees 0 devices")
    return sec, nv, handles


class XidWatch:
    """Critical XID events (NVML event set) raised while the probe runs.

    NVML reports only events after registration, so this covers the probe's own window: a GPU that
    throws XIDs under the copy load shows here. Older XIDs live in the kernel log (NVRM: Xid)."""

    def __init__(self, nv, handles: dict):
        self.nv, self.t0, self.set, self.registered, self.reason = nv, time.monotonic(), None, [], None
        if nv is None or not handles:
            self.reason = "no NVML GPU to watch"
            return
        try:
            self.set = nv.nvmlEventSetCreate()
            for bdf, h in handles.items():
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self.set)
                    self.registered.append(bdf)
                except nv.NVMLError as exc:
                    self.reason = f"XID events not available: {exc}"
        except (nv.NVMLError, AttributeError) as exc:
            self.reason = f"XID events not available: {_err(exc)}"

    def finish(self) -> dict:
        out = {"window_s": round(time.monotonic() - self.t0, 2), "watched": self.registered}
        if not self.registered:
            out.update(status="skipped", reason=self.reason or "no GPU registered for XID events")
            return out
        events = []
        try:
            while True:
                try:
                    d = self.nv.nvmlEventSetWait_v2(self.set, 0)
                except self.nv.NVMLError:  # NVML_ERROR_TIMEOUT: no more events queued
                    break
                bdf = None
                try:
                    bdf = norm_bdf(self.nv.nvmlDeviceGetPciInfo(d.device).busId)
                except self.nv.NVMLError:
                    pass
                events.append({"bus_id": bdf, "xid": int(d.eventData)})
                if len(events) >= 100:
                    break
        finally:
            try:
                self.nv.nvmlEventSetFree(self.set)
            except self.nv.NVMLError:
                pass
        out.update(status="ok", events=events)
        return out


# -- torch bandwidth probes ---------------------------------------------------------------------
def torch_section():
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising OSError on a missing .so
        return {"status": "skipped", "reason": f"torch not importable ({_err(exc)})"}, None
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
            sec["nccl_error"] = _err(exc)
    except Exception as exc:
        sec.update(status="failed", reason=f"CUDA init failed: {_err(exc)}")
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
                reasons.update(_reasons(fn(h)))
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
        return {**base, "status": "failed", "reason": _err(exc)}


def parse_pairs(text: str | None):
    """'0-1,0-4' -> [(0, 1), (0, 4)]; None -> None (every ordered pair)."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        if part.strip():
            a, _, b = part.strip().partition("-")
            out.append((int(a), int(b)))
    return out


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


def parse_sets(text: str | None):
    """'0,1,2,3;4,5,6,7' -> [[0,1,2,3],[4,5,6,7]]; '' -> []; None -> None (default sets)."""
    if text is None:
        return None
    sets = []
    for part in text.split(";"):
        part = part.strip()
        if part:
            sets.append([int(x) for x in part.split(",") if x.strip()])
    return sets


# Environment that shapes NCCL/collectives, recorded so a run shows what it ran under (and the
# NCCL profile comparison can prove its children kept NVLink multicast off).
ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "TORCH_NCCL_")


def parse_bytes(text: str | None):
    """'1048576,256M,1G' -> [1048576, 268435456, 1073741824]; None -> None (the default size)."""
    if text is None:
        return None
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("IB").removesuffix("B")
        if part:
            out.append(int(part[:-1]) * mult[part[-1]] if part[-1] in mult else int(part))
    return out


def collect(
    *,
    quick: bool = False,
    bandwidth: bool = True,
    p2p: bool = True,
    allreduce_sets=None,
    p2p_pairs=None,
    copies: bool = True,
    allreduce_bytes=None,
) -> dict:
    t0 = time.monotonic()
    doc = {
        "schema": SCHEMA,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    try:
        nvml, nv, handles = nvml_section()
    except Exception as exc:
        nvml, nv, handles = {"status": "failed", "reason": _err(exc)}, None, {}
    doc["nvml"] = nvml
    watch = XidWatch(nv, handles)
    if not bandwidth:
        doc["torch"] = {"status": "skipped", "reason": "bandwidth probes off (--no-bandwidth)"}
        doc["bandwidth"] = {"status": "skipped", "reason": "bandwidth probes off (--no-bandwidth)"}
    else:
        tsec, torch = torch_section()
        doc["torch"] = tsec
        if torch is None:
            doc["bandwidth"] = {"status": tsec["status"], "reason": tsec.get("reason")}
        else:
            try:
                doc["bandwidth"] = bandwidth_section(
                    torch,
                    nv,
                    handles,
                    quick=quick,
                    p2p=p2p,
                    allreduce_sets=allreduce_sets,
                    p2p_pairs=p2p_pairs,
                    copies=copies,
                    allreduce_bytes=allreduce_bytes,
                )
            except Exception as exc:
                doc["bandwidth"] = {"status": "failed", "reason": _err(exc)}
    doc["xid"] = watch.finish()
    if nv is not None:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    doc["seconds"] = round(time.monotonic() - t0, 2)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="probe", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller buffers, fewer repetitions")
    ap.add_argument("--no-bandwidth", action="store_true", help="NVML facts only")
    ap.add_argument("--no-p2p", action="store_true", help="skip the GPU pair copies")
    ap.add_argument(
        "--allreduce-sets",
        default=None,
        metavar="SETS",
        help="GPU sets for the all-reduce, e.g. '0,1,2,3;4,5,6,7' ('' for none)",
    )
    ap.add_argument(
        "--p2p-pairs",
        default=None,
        metavar="PAIRS",
        help="GPU pairs to copy between, e.g. '0-1,0-4' (default: every ordered pair)",
    )
    ap.add_argument(
        "--no-copies", action="store_true", help="skip the per-GPU H2D/D2H/D2D copies (e.g. all-reduce only)"
    )
    ap.add_argument(
        "--allreduce-bytes",
        default=None,
        metavar="SIZES",
        help="all-reduce buffer sizes, e.g. '1M,256M' (default: one size, 256 MiB; quick 64 MiB)",
    )
    ap.add_argument("--indent", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        ar_bytes = parse_bytes(a.allreduce_bytes)
    except (ValueError, IndexError):
        ap.error(f"--allreduce-bytes {a.allreduce_bytes!r}: give sizes like 1048576 or 1M,256M")
    doc = collect(
        quick=a.quick,
        bandwidth=not a.no_bandwidth,
        p2p=not a.no_p2p,
        allreduce_sets=parse_sets(a.allreduce_sets),
        p2p_pairs=parse_pairs(a.p2p_pairs),
        copies=not a.no_copies,
        allreduce_bytes=ar_bytes,
    )
    sys.stdout.write(json.dumps(doc, indent=a.indent) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
