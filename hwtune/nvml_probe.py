"""Read GPU topology through NVML. Self-contained (standard library + pynvml only): gpubox runs
this module as a payload (gpubox.transport.payload) with python3 on the target host or container, so the same code runs where
the GPUs are, and tests call `collect()` with a recorded pynvml-like object.

Output: {"source": "nvml", "driver", "gpus": [...], "pairs": {"i-j": {...}}, "errors": [...]}.
"""

from __future__ import annotations

import json
import sys

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi topo -m legend.
LEVELS = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _s(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def norm_bus_id(bus_id) -> str:
    """NVML's 00000000:17:00.0 -> sysfs' 0000:17:00.0."""
    text = _s(bus_id).strip().lower()
    dom, rest = text.split(":", 1)
    return f"{int(dom, 16):04x}:{rest}"


def _try(errors, what, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # NVMLError_NotSupported and friends: record, carry on
        errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return None


def _read_numa_sysfs(bus_id: str):
    try:
        with open(f"/sys/bus/pci/devices/{bus_id}/numa_node") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _numa_from_affinity(nvml, h, sysroot="/sys/devices/system/node"):
    """The node whose cpulist holds every CPU of NVML's CPU affinity for the GPU (as nvidia-smi
    topo -m "NUMA Affinity"); None when they span nodes or nothing is known. numa_node is -1 in
    VMs (docs/facts.md "A real GPU machine"), and nvmlDeviceGetNumaNodeId answers NotSupported there (seen on an H200 VM)."""
    import os

    try:
        words = nvml.nvmlDeviceGetCpuAffinity(h, 16)
        cpus = {w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1}
        found = set()
        for n in os.listdir(sysroot):
            if n.startswith("node") and n[4:].isdigit():
                with open(f"{sysroot}/{n}/cpulist") as fh:
                    node = set()
                    for part in fh.read().strip().split(","):
                        if part:
                            a, _, b = part.partition("-")
                            node.update(range(int(a), int(b or a) + 1))
                if cpus & node:
                    found.add(int(n[4:]))
        return found.pop() if len(found) == 1 else None
    except Exception:
        return None


def _nvlink_p2p(nvml, a, b) -> bool:
    """NVML's own answer to "can these two GPUs talk P2P over NVLink" (False when it cannot tell)."""
    fn = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
    if fn is None:
        return False
    try:
        return fn(a, b, getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)) == getattr(
            nvml, "NVML_P2P_STATUS_OK", 0
        )
    except Exception:
        return False


def collect(nvml, read_numa=_read_numa_sysfs) -> dict:
    """Topology from a pynvml-like module (already importable; nvmlInit is called here)."""
    nvml.nvmlInit()
    errors: list[str] = []
    try:
        driver = _s(_try(errors, "driver", nvml.nvmlSystemGetDriverVersion) or "")
        count = nvml.nvmlDeviceGetCount()
        handles, gpus = [], []
        for i in range(count):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            pci = nvml.nvmlDeviceGetPciInfo(h)
            bus = norm_bus_id(getattr(pci, "busId", None) or pci.busIdLegacy)
            mem = _try(errors, f"gpu{i} memory", nvml.nvmlDeviceGetMemoryInfo, h)
            numa = None
            if hasattr(nvml, "nvmlDeviceGetNumaNodeId"):
                numa = _try(errors, f"gpu{i} numa", nvml.nvmlDeviceGetNumaNodeId, h)
            if numa is None and read_numa is not None:
                numa = read_numa(bus)
            if (numa is None or numa < 0) and read_numa is _read_numa_sysfs:
                numa = _numa_from_affinity(nvml, h)
            if numa is not None and numa < 0:
                numa = None  # -1: no NUMA information (docs/facts.md), not node 0
            gpus.append(
                {
                    "index": i,
                    "name": _s(nvml.nvmlDeviceGetName(h)),
                    "uuid": _s(_try(errors, f"gpu{i} uuid", nvml.nvmlDeviceGetUUID, h) or ""),
                    "bus_id": bus,
                    "numa_node": numa,
                    "link_gen": _try(errors, f"gpu{i} link gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    "link_width": _try(errors, f"gpu{i} link width", nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                    "max_link_gen": _try(
                        errors, f"gpu{i} max link gen", nvml.nvmlDeviceGetMaxPcieLinkGeneration, h
                    ),
                    "max_link_width": _try(
                        errors, f"gpu{i} max link width", nvml.nvmlDeviceGetMaxPcieLinkWidth, h
                    ),
                    "memory_mib": int(mem.total) // (1 << 20) if mem is not None else None,
                }
            )
        # NVLink: count active links whose remote end is another GPU of this box. Links whose
        # remote end is not one of our GPUs go to an NVSwitch (HGX boards): counted per GPU, and a
        # pair is NVLink-connected through the switches when NVML says P2P over NVLink works.
        by_bus = {g["bus_id"]: g["index"] for g in gpus}
        nvlinks: dict[tuple[int, int], int] = {}
        switch_links: dict[int, int] = {}
        max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
        for i, h in enumerate(handles):
            for link in range(max_links):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(h, link) != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                        continue
                    remote = norm_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                except Exception:
                    break  # no NVLink on this GPU (NotSupported) or past its last link
                j = by_bus.get(remote)
                if j is None:
                    switch_links[i] = switch_links.get(i, 0) + 1
                elif j > i:  # count each link once, from its lower-index end
                    nvlinks[(i, j)] = nvlinks.get((i, j), 0) + 1
        pairs = {}
        for i in range(count):
            for j in range(i + 1, count):
                lvl = _try(
                    errors,
                    f"topology {i}-{j}",
                    nvml.nvmlDeviceGetTopologyCommonAncestor,
                    handles[i],
                    handles[j],
                )
                n = nvlinks.get((i, j), 0)
                pair = {}
                if (
                    not n
                    and switch_links.get(i)
                    and switch_links.get(j)
                    and _nvlink_p2p(nvml, handles[i], handles[j])
                ):
                    n = min(switch_links[i], switch_links[j])
                    pair["via"] = "NVSwitch"
                pairs[f"{i}-{j}"] = {
                    "relation": f"NV{n}" if n else "PCIe",
                    "level": LEVELS.get(int(lvl), str(lvl)) if lvl is not None else None,
                    "nvlinks": n,
                    **pair,
                }
        return {"source": "nvml", "driver": driver, "gpus": gpus, "pairs": pairs, "errors": errors}
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def main() -> int:
    try:
        import pynvml
    except ImportError as exc:
        print(json.dumps({"source": "nvml", "unavailable": f"pynvml not importable: {exc}"}))
        return 3
    try:
        doc = collect(pynvml)
    except Exception as exc:
        print(json.dumps({"source": "nvml", "unavailable": f"{type(exc).__name__}: {exc}"}))
        return 3
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
