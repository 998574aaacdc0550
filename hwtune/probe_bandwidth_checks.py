"""The probe's verdict on its bandwidth figures: each measurement against its own reference (the
GPU's link rate for host copies, its memory spec for device copies, the pair's path for P2P, the
ring's slowest hop or a floor for all-reduce), and one row per GPU pair's path on NVLink boxes.
A GPU-to-GPU figure beyond what the PCIe path carries proves another link and is judged against
NVLink (the GPU model's figure), never as a ratio to the PCIe rate.

Pure functions of the probe document (probe_doc.ProbeDoc); the paths come from hwtune/links.py.
"""

from __future__ import annotations

from typing import Any

from gpubox.steps import DRIFT, FAILED, OK, SKIPPED

from .links import all_paths, pair_path, ring_reference
from .probe_check import Check, Evidence, pct_check
from .probe_doc import BandwidthProbe, ProbeDoc
from .probe_limits import expected_link, host_link_spec, mem_spec_tbs, nvlink_spec_gbps


def check_bandwidth(doc: ProbeDoc, lim: dict[str, Any]) -> list[Check]:
    """One check per bandwidth probe, each judged by its own pass against its reference: the
    link's rate (host copies), the memory spec (device copies), the pair's path (P2P), the ring's
    slowest hop or a floor (all-reduce)."""
    bw = doc.bandwidth
    if bw.status != "ok":
        status = SKIPPED if bw.status == "skipped" else FAILED
        return [Check("bandwidth", status, bw.reason or "no bandwidth section")]
    passes = {"h2d": _check_host_copy, "d2h": _check_host_copy, "d2d": _check_device_copy}
    passes.update(p2p=_check_p2p, allreduce=_check_allreduce)
    out: list[Check] = []
    for p in doc.probes:
        judge_probe = passes.get(p.name or "")
        if judge_probe is None:
            continue
        label = _probe_label(doc, p)
        if p.status != "ok":
            out.append(_not_run(label, p))
        else:
            out.append(judge_probe(doc, p, lim, label, {"probe": p.to_json()}))
    return out


def _torch_label(doc: ProbeDoc, bus_id: str | None, index: int | None) -> str:
    g = doc.gpu_for(bus_id, index)
    return g.label if g else f"cuda{index}"


def _probe_label(doc: ProbeDoc, p: BandwidthProbe) -> str:
    if p.name == "p2p":
        a = _torch_label(doc, doc.bus_of(p.src), p.src)
        b = _torch_label(doc, doc.bus_of(p.dst), p.dst)
        return f"p2p {a}->{b}"
    if p.name == "allreduce":
        return "allreduce " + ",".join(map(str, p.gpus))
    return f"{_torch_label(doc, p.bus_id, p.gpu)} {p.name}"


def _not_run(label: str, p: BandwidthProbe) -> Check:
    st = SKIPPED if p.status == "skipped" else FAILED
    return Check(
        label,
        st,
        p.reason or "probe did not run",
        {"probe": p.to_json()},
        repair=None
        if st == SKIPPED
        else "run `gpubox probe -v` on the box; check the server is not holding the GPU memory",
    )


def _check_host_copy(
    doc: ProbeDoc, p: BandwidthProbe, lim: dict[str, Any], label: str, ev: Evidence
) -> Check:
    """h2d / d2h against the GPU's link rate."""
    kind = p.name or ""
    g = doc.gpu_for(p.bus_id, p.gpu)
    ref, ref_label = expected_link(g, lim)
    gbps = p.gbps or 0.0
    args = (
        lim[f"{kind}_min_pct"],
        "GB/s",
        ev,
        f"{kind.upper()} slow:",
        "link trained down, non-pinned/NUMA-remote host memory, or IOMMU translation",
        "check the link check above, `nvidia-smi topo -m` NUMA affinity, iommu=pt",
    )
    spec = host_link_spec(g.name if g else None)
    if ref and gbps > ref and g and spec:  # Grace: the host copy went over NVLink-C2C, not PCIe
        rate, link = spec
        ev.update(beyond_pcie=True, pcie_gbps=ref)
        ref_label = (
            f"{link} ({g.name}: {rate:g} GB/s per direction, datasheet; the figure is beyond {ref_label})"
        )
        ref = rate
    return pct_check(label, gbps, ref, ref_label, *args)


def _check_device_copy(
    doc: ProbeDoc, p: BandwidthProbe, lim: dict[str, Any], label: str, ev: Evidence
) -> Check:
    """d2d against the GPU model's memory bandwidth spec."""
    g = doc.gpu_for(p.bus_id, p.gpu)
    tbs = mem_spec_tbs(g.name if g else None, lim.get("mem_bw_tbs"))
    ref = tbs * 1000 if tbs else None
    gname = (g.name if g else None) or "unknown GPU"
    return pct_check(
        label,
        p.gbps or 0.0,
        ref,
        f"{gname} spec {tbs} TB/s" if tbs else f"{gname} not in the table",
        lim["d2d_min_pct"],
        "TB/s",
        ev,
        "device memory slow:",
        "memory clock held down (thermal/power) or another process using the GPU",
        "check the clocks check and `nvidia-smi` for other processes",
        scale=1000.0,
    )


def _pcie_reference(
    doc: ProbeDoc, indexes: list[int | None], lim: dict[str, Any]
) -> tuple[float | None, str]:
    """The slowest PCIe link of these GPUs (torch indexes): what a path without NVLink carries."""
    rates = [expected_link(doc.gpu_of(i), lim)[0] for i in indexes]
    ref = min(r for r in rates if r) if rates and all(rates) else None
    return ref, f"link {ref} GB/s" if ref else "unknown link"


def _check_p2p(doc: ProbeDoc, p: BandwidthProbe, lim: dict[str, Any], label: str, ev: Evidence) -> Check:
    """A GPU pair against its path (NVLink figures, else the slower of the two links; a figure
    beyond that PCIe rate against NVLink, _beyond_pcie); a pair without peer access is drift
    whatever it measured."""
    gbps = p.gbps or 0.0
    if p.src == p.dst:
        return Check(
            label, SKIPPED, f"same GPU ({gbps:.1f} GB/s): a code-path exercise, not a P2P figure", ev
        )
    path = (
        pair_path(doc.raw, min(p.src, p.dst), max(p.src, p.dst))
        if p.src is not None and p.dst is not None and _has_index(doc, [p.src, p.dst])
        else None
    )
    if path is None or (path.kind == "pcie" and lim.get("link_gbps")):
        ref, ref_label = _pcie_reference(doc, [p.src, p.dst], lim)
    else:
        ref, ref_label = path.gbps, path.label
        ev["path"] = path.to_dict()
    ev["peer_access"] = p.peer_access
    if p.peer_access is False:
        return Check(
            label,
            DRIFT,
            f"{gbps:.1f} GB/s without peer access (staged through host memory)",
            ev,
            cause="P2P is off between these GPUs: IOMMU/ACS on the PCIe path, or not supported",
            repair="check ACS/IOMMU settings (iommu=pt, ACS off on the switches); NCCL_P2P_LEVEL",
        )
    args = (
        lim["p2p_min_pct"],
        "GB/s",
        ev,
        "P2P slow:",
        "an NVLink down or trained slower, or the pair crosses the CPU interconnect (SYS)",
        "see `nvidia-smi nvlink --status` and `nvidia-smi topo -m`; keep TP groups on one NUMA node",
    )
    if ref and gbps > ref and (path is None or path.kind == "pcie"):
        return _beyond_pcie(doc, label, gbps, ref, ref_label, [p.src, p.dst], *args)
    return pct_check(label, gbps, ref, ref_label, *args)


def _check_allreduce(
    doc: ProbeDoc, p: BandwidthProbe, lim: dict[str, Any], label: str, ev: Evidence
) -> Check:
    """NCCL all-reduce bus bandwidth against a configured floor, else the ring's slowest hop."""
    gpus = p.gpus
    if len(gpus) < 2:
        return Check(
            label, SKIPPED, f"one rank moves no bus traffic (NCCL ran: algbw {p.algbw_gbps} GB/s)", ev
        )
    busbw = p.busbw_gbps or 0.0
    if lim.get("allreduce_min_busbw_gbps"):
        floor = float(lim["allreduce_min_busbw_gbps"])
        detail = f"busbw {busbw:.1f} GB/s (algbw {p.algbw_gbps}), min {floor:g} GB/s"
        ev.update(floor_gbps=floor)
        st = OK if busbw >= floor else DRIFT
        return Check(
            label,
            st,
            detail if st == OK else f"all-reduce slow: {detail}",
            ev,
            cause=None if st == OK else "NCCL transport or topology (P2P off, cross-NUMA ring)",
            repair=None if st == OK else "check the NCCL profile (gpubox nccl) and P2P checks",
        )
    hop = ring_reference(doc.raw, list(gpus)) if _has_index(doc, list(gpus)) else None
    if hop is not None and hop.gbps and not (hop.kind == "pcie" and lim.get("link_gbps")):
        ref, ref_label = hop.gbps, f"slowest hop {hop.a}-{hop.b}: {hop.label}"
        ev["path"] = hop.to_dict()
    else:
        ref, ref_label = _pcie_reference(doc, list(gpus), lim)
    args = (
        lim["allreduce_min_pct"],
        "GB/s busbw",
        ev,
        "all-reduce slow:",
        "NCCL transport or topology (P2P off, cross-NUMA ring, wrong NCCL env)",
        "check the NCCL profile (gpubox nccl) and the P2P checks",
    )
    if ref and busbw > ref and (hop is None or hop.kind == "pcie"):
        return _beyond_pcie(doc, label, busbw, ref, ref_label, list(gpus), *args)
    return pct_check(label, busbw, ref, ref_label, *args)


def _beyond_pcie(
    doc: ProbeDoc,
    label: str,
    value: float,
    pcie: float,
    pcie_label: str,
    indexes: list[int | None],
    min_pct: float,
    unit: str,
    ev: Evidence,
    what: str,
    cause: str,
    repair: str,
) -> Check:
    """A GPU-to-GPU figure above the PCIe rate of the GPUs' links did not cross PCIe: NVLink or an
    NVSwitch carried it (a document without NVLink facts cannot say which). Judged against the
    GPU model's NVLink bandwidth (KNOWN_NVLINK), never as a ratio to the PCIe rate; not judged for
    a model not in the table. Without an NVSwitch, a full mesh gives a set of k of the box's n GPUs
    (k-1)/(n-1) of each GPU's NVLink, so the minimum scales by that share (the least a healthy
    NVLink box gives the set); with an NVSwitch the set gets it all."""
    gpus = [doc.gpu_of(i) for i in indexes]
    names = sorted({g.name or "unknown GPU" for g in gpus if g}) or ["unknown GPU"]
    specs = [nvlink_spec_gbps(g.name) if g else None for g in gpus]
    beyond = f"beyond what the PCIe path carries ({pcie_label})"
    ev.update(beyond_pcie=True, pcie_gbps=pcie)
    if not specs or not all(specs):
        return Check(
            label,
            SKIPPED,
            f"{value:.1f} {unit}: {beyond}, so it did not cross that link (NVLink/NVSwitch, or link facts "
            f"that are not the path's); no NVLink figure known for {', '.join(names)} to judge against",
            ev,
            repair="run the current probe: it records NVML's NVLink facts, which give the path's rate",
        )
    total = min(s for s in specs if s)
    n, k = len(doc.gpus), len(set(indexes))
    share = ""
    if n > k:
        min_pct = round(min_pct * (k - 1) / (n - 1), 1)
        share = f"; a full mesh without NVSwitch gives {k} of {n} GPUs {k - 1}/{n - 1} of it"
    ev["nvlink_spec_gbps"] = total
    ref_label = (
        f"NVLink/NVSwitch ({', '.join(names)}: {total:g} GB/s per direction, datasheet{share}; {beyond})"
    )
    return pct_check(label, value, total, ref_label, min_pct, unit, ev, what, cause, repair)


def _has_index(doc: ProbeDoc, indexes: list[int]) -> bool:
    """Each torch index maps to the NVML record of the same index (bus ids agree, or none recorded)."""
    for i in indexes:
        g = doc.gpu_of(i)
        if g is None or g.index != i:
            return False
    return True


def check_paths(doc: ProbeDoc) -> list[Check]:
    """One row per GPU pair with NVLink anywhere on the box: the path, and links down or slower
    than the siblings (a degraded NVLink that sends traffic over PCIe)."""
    if not any(g.nvlink and g.nvlink.links for g in doc.gpus):
        return []
    out = []
    for path in all_paths(doc.raw):
        name = f"path gpu{path.a}-gpu{path.b}"
        numa = {"cross": ", across NUMA nodes", "same": ", same NUMA node"}.get(path.numa, "")
        if path.problems:
            out.append(
                Check(
                    name,
                    DRIFT,
                    f"{path.label}{numa}: " + "; ".join(path.problems),
                    {"path": path.to_dict()},
                    cause="an NVLink is down or trained slower (cable/bridge, NVSwitch, or a GPU fault)",
                    repair="`nvidia-smi nvlink --status` / `-e` on the host; reset the GPUs or service the link",
                )
            )
        else:
            out.append(Check(name, OK, path.label + numa, {"path": path.to_dict()}))
    return out
