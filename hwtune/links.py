"""The path two GPUs of a probe document talk over, and what it should carry.

NVLink pairs are judged against NVLink (active links x per-link rate), PCIe pairs against the
slower of the two PCIe links, and a pair whose GPUs sit on different NUMA nodes is said to cross
the CPU interconnect. A pair with a link down, or with fewer active links / a lower per-link
rate than its siblings, is flagged: traffic that silently falls back to PCIe is the failure a
PCIe-only reference could never show (issue 18: 386 GB/s P2P was judged "613% of 63 GB/s").

Reads only hwtune/probe.py's document (`nvml.gpus[].nvlink`, `.numa`, `.pcie`), so CI judges
recorded runs without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# GB/s per link and direction by the value nvmlDeviceGetNvLinkVersion returns: an nvml.h enum
# (NVML_NVLINK_VERSION_1_0 = 1, 2_0 = 2, 2_2 = 3, 3_0 = 4, 3_1 = 5, 4_0 = 6, 5_0 = 7), not the
# version number: a real H200 answered 6 (NVLink 4.0). 26.562 GB/s is what `nvidia-smi nvlink
# --status` printed per link on that machine (tests/fixtures/probe/h200x2_nvswitch/system.txt);
# 25 GB/s (NVLink 2/3) and 50 GB/s (NVLink 5) are NVIDIA's per-link, per-direction figures.
NVLINK_GBPS_BY_VERSION = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 26.562, 7: 50.0}
NVLINK_NAME = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass
class Path:
    a: int
    b: int
    kind: str  # nvlink | nvswitch | pcie | unknown
    gbps: float | None  # what the path should carry per direction
    label: str  # "NVLink 18 x 26.6 GB/s = 478 GB/s"
    links: int = 0
    link_gbps: float | None = None
    numa: str = "unknown"  # same | cross | unknown
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("a", "b", "kind", "gbps", "label", "links", "link_gbps", "numa", "problems")
        }


def _gpus(doc: dict) -> list[dict]:
    return [
        g for g in ((doc.get("nvml") or {}).get("gpus") or []) if isinstance(g, dict) and not g.get("error")
    ]


def pcie_gbps(g: dict) -> float | None:
    pc = g.get("pcie") or {}
    gen, width = pc.get("gen_max"), pc.get("width_max")
    if gen in PCIE_LANE_GBPS and width:
        return round(PCIE_LANE_GBPS[gen] * width, 1)
    return None


def numa_node(g: dict) -> int | None:
    n = (g.get("numa") or {}).get("node")
    return n if isinstance(n, int) and n >= 0 else None


def link_gbps(nvl: dict) -> float | None:
    """Per-link rate: NVML's common speed field (MB/s), else the version table."""
    if nvl.get("speed_mbps_common"):
        return round(nvl["speed_mbps_common"] / 1000.0, 3)
    versions = [r.get("version") for r in nvl.get("links") or [] if r.get("active") and r.get("version")]
    return NVLINK_GBPS_BY_VERSION.get(max(versions)) if versions else None


def _nvlinks_between(ga: dict, gb: dict) -> tuple[int, int, bool]:
    """(active links a->b, inactive links whose remote is b, a reaches switches)."""
    nvl = ga.get("nvlink") or {}
    active = down = 0
    switch = False
    for r in nvl.get("links") or []:
        if r.get("remote_type") == "switch":
            switch = switch or bool(r.get("active"))
            continue
        if r.get("remote") == gb.get("bus_id"):
            if r.get("active"):
                active += 1
            else:
                down += 1
    return active, down, switch


def _link_problems(g: dict) -> list[str]:
    """An NVLink of this GPU that is down, or runs slower than the GPU's other links."""
    links = (g.get("nvlink") or {}).get("links") or []
    out = []
    down = [r["link"] for r in links if not r.get("active")]
    if down:
        out.append(
            f"gpu{g.get('index')}: {len(down)} of {len(links)} NVLinks down (links {','.join(map(str, down))})"
        )
    speeds = [r.get("speed_mbps") for r in links if r.get("active") and r.get("speed_mbps")]
    if speeds and min(speeds) < max(speeds):
        slow = [
            r["link"]
            for r in links
            if r.get("active") and r.get("speed_mbps") and r["speed_mbps"] < max(speeds)
        ]
        out.append(
            f"gpu{g.get('index')}: links {','.join(map(str, slow))} at {min(speeds) / 1000:.1f} GB/s, "
            f"siblings {max(speeds) / 1000:.1f} GB/s"
        )
    return out


def _down_links(g: dict) -> int:
    return sum(1 for r in ((g.get("nvlink") or {}).get("links") or []) if not r.get("active"))


def pair_path(doc: dict, a: int, b: int) -> Path:
    by_index = {g.get("index"): g for g in _gpus(doc)}
    ga, gb = by_index.get(a), by_index.get(b)
    if ga is None or gb is None:
        return Path(a, b, "unknown", None, "unknown path (no NVML record)")
    na, nb = numa_node(ga), numa_node(gb)
    numa = "unknown" if na is None or nb is None else ("same" if na == nb else "cross")
    n, down, switch_a = _nvlinks_between(ga, gb)
    _, _, switch_b = _nvlinks_between(gb, ga)
    rate = link_gbps(ga.get("nvlink") or {}) or link_gbps(gb.get("nvlink") or {})
    problems = [x for g in (ga, gb) for x in _link_problems(g)]
    if n and rate:
        return Path(
            a,
            b,
            "nvlink",
            round(n * rate, 1),
            f"NVLink {n} x {rate:.1f} GB/s = {n * rate:.0f} GB/s",
            n,
            rate,
            numa,
            problems,
        )
    if switch_a and switch_b and rate:
        k = min((ga.get("nvlink") or {}).get("active") or 0, (gb.get("nvlink") or {}).get("active") or 0)
        return Path(
            a,
            b,
            "nvswitch",
            round(k * rate, 1),
            f"NVSwitch {k} x {rate:.1f} GB/s = {k * rate:.0f} GB/s",
            k,
            rate,
            numa,
            problems,
        )
    ra, rb = pcie_gbps(ga), pcie_gbps(gb)
    ref = min(r for r in (ra, rb) if r) if (ra or rb) else None
    label = f"PCIe {ref} GB/s (slower link)" if ref else "unknown PCIe link"
    if numa == "cross":
        label += f", across NUMA nodes {na}/{nb} (CPU interconnect)"
    if (
        (ga.get("nvlink") or {}).get("links")
        and (gb.get("nvlink") or {}).get("links")
        and (down or _down_links(ga))
    ):
        problems.append("NVLink present but no active link between the pair: traffic falls back to PCIe")
    return Path(a, b, "pcie", ref, label, 0, None, numa, problems)


def all_paths(doc: dict) -> list[Path]:
    """Every unordered GPU pair, with sibling comparison: an NVLink pair with fewer links or a lower
    per-link rate than the best pair of the same kind is flagged."""
    idx = sorted(g.get("index") for g in _gpus(doc))
    paths = [pair_path(doc, a, b) for i, a in enumerate(idx) for b in idx[i + 1 :]]
    nv = [p for p in paths if p.kind in ("nvlink", "nvswitch")]
    if nv:
        best_links = max(p.links for p in nv)
        best_rate = max(p.link_gbps or 0 for p in nv)
        for p in nv:
            if p.links < best_links:
                p.problems.append(f"{p.links} active NVLinks, siblings have {best_links}")
            if p.link_gbps and p.link_gbps < best_rate:
                p.problems.append(f"{p.link_gbps} GB/s per link, siblings run {best_rate}")
        # A pair without NVLink on a box where other pairs have it, when both GPUs do have NVLink links.
        for p in paths:
            if p.kind == "pcie" and not any("NVLink" in x for x in p.problems):
                gi = {g.get("index"): g for g in _gpus(doc)}
                if (
                    (gi[p.a].get("nvlink") or {}).get("links")
                    and (gi[p.b].get("nvlink") or {}).get("links")
                    and any({q.a, q.b} & {p.a, p.b} for q in nv)
                ):
                    p.problems.append("no active NVLink between the pair while its siblings have NVLink")
    return paths


def ring_reference(doc: dict, gpus: list[int]) -> Path | None:
    """The slowest hop of the ring gpus[0] -> gpus[1] -> ... -> gpus[0]: all-reduce busbw cannot
    beat it. None for a single GPU."""
    if len(gpus) < 2:
        return None
    hops = [pair_path(doc, min(x, y), max(x, y)) for x, y in zip(gpus, gpus[1:] + gpus[:1]) if x != y]
    known = [h for h in hops if h.gbps]
    if not known:
        return hops[0]
    return min(known, key=lambda h: (h.gbps, h.numa != "cross"))


def classify(doc: dict) -> str:
    """Box topology class for profile selection: single-gpu, nvswitch, nvlink, pcie-multi-numa,
    pcie-single-numa, or unknown."""
    gpus = _gpus(doc)
    if len(gpus) <= 1:
        return "single-gpu" if gpus else "unknown"
    paths = all_paths(doc)
    if all(p.kind == "nvswitch" for p in paths):
        return "nvswitch"
    if any(p.kind in ("nvlink", "nvswitch") for p in paths):
        return "nvlink"
    nodes = {numa_node(g) for g in gpus}
    if None in nodes:
        return "unknown"
    return "pcie-multi-numa" if len(nodes) > 1 else "pcie-single-numa"


def classify_topology(topo) -> str:
    """The same classes from a hwtune.topology.Topology (nvml_probe/sysfs/inventory sources)."""
    gpus = list(topo.gpus)
    if len(gpus) <= 1:
        return "single-gpu" if gpus else "unknown"
    rels = list(topo.pairs.values())
    if rels and all(r.get("via") == "NVSwitch" for r in rels):
        return "nvswitch"
    if any(r.get("nvlinks") for r in rels):
        return "nvlink"
    nodes = {g.numa_node for g in gpus}
    if None in nodes:
        return "unknown"
    return "pcie-multi-numa" if len(nodes) > 1 else "pcie-single-numa"
