"""The probe's NVML facts: driver and per-GPU state (PCIe link, ECC, row remapping, clocks and
their event reasons, power, application clocks) and the critical XID events raised while the
probe runs. NVLink, fabric and NUMA facts are in probe_topology.py.

Part of the standalone probe script (hwtune/probe.py): standard library plus pynvml when it is
importable; a field NVML does not support is recorded, never fatal.
"""

from __future__ import annotations

import sys
import time

if __package__:
    from .probe_common import MIB, NvmlFields, as_text, error_text, norm_bdf
    from .probe_topology import fabric_facts, numa_facts, nvlink_facts
else:  # run by path (python3 hwtune/probe.py): the sibling modules sit next to it on sys.path
    from probe_common import MIB, NvmlFields, as_text, error_text, norm_bdf
    from probe_topology import fabric_facts, numa_facts, nvlink_facts

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


def reasons_of(mask):
    if mask is None:
        return None
    return {"mask": int(mask), "active": [n for bit, n in sorted(CLOCK_REASONS.items()) if mask & bit]}


def _clock_reasons(nv, h, f: NvmlFields):
    fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return reasons_of(f.get("clock_event_reasons", fn, h))


def gpu_facts(nv, h, index: int) -> dict:
    """Everything NVML tells about one GPU that bears on its health and its links."""
    f = NvmlFields(nv)
    g: dict = {"index": index}
    g["name"] = as_text(f.get("name", nv.nvmlDeviceGetName, h))
    g["uuid"] = as_text(f.get("uuid", nv.nvmlDeviceGetUUID, h))
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
    f = NvmlFields(nv)
    sec["driver"] = as_text(f.get("driver", nv.nvmlSystemGetDriverVersion))
    cuda = f.get(
        "cuda_driver",
        getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None) or nv.nvmlSystemGetCudaDriverVersion,
    )
    sec["cuda_driver"] = None if cuda is None else f"{cuda // 1000}.{(cuda % 1000) // 10}"
    sec["nvml"] = as_text(f.get("nvml", nv.nvmlSystemGetNVMLVersion))
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
            self.reason = f"XID events not available: {error_text(exc)}"

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
