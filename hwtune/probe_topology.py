"""The probe's topology facts for one GPU: its NVLinks (state, version, remote, speed), its NVSwitch
fabric registration, and its NUMA node (NVML, sysfs, else the CPU affinity).

Part of the standalone probe script (hwtune/probe.py): standard library plus the pynvml module
it is handed; every reader survives a pynvml without the call it wants.
"""

from __future__ import annotations

import os

if __package__:
    from .probe_common import NvmlFields, error_text, norm_bdf
else:  # run by path (python3 hwtune/probe.py): the sibling modules sit next to it on sys.path
    from probe_common import NvmlFields, error_text, norm_bdf

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def fabric_facts(nv, h, f: NvmlFields) -> dict | None:
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


def nvlink_facts(nv, h, f: NvmlFields) -> dict | None:
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
        f.unsupported["nvlink_speed"] = error_text(exc)
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
            f.unsupported["nvlink_speed_per_link"] = error_text(exc)
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


def numa_facts(nv, h, bus_id, f: NvmlFields) -> dict:
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
