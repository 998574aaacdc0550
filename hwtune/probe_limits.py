"""The probe's limits: the defaults, the inventory's `gpubox_probe` mapping checked against them,
and the reference rates the figures are judged against (PCIe link rates, memory bandwidth by GPU
model, NVLink and NVLink-C2C bandwidth by GPU model).
"""

from __future__ import annotations

from typing import Any

from gpubox.errors import GpuboxError

from .probe_doc import GpuFacts

# Limits, overridable per box with the inventory variable `gpubox_probe` (a mapping).
DEFAULTS: dict[str, Any] = {
    "h2d_min_pct": 70,  # pinned host->device copy, % of the link's theoretical rate
    "d2h_min_pct": 70,
    "d2d_min_pct": 70,  # device memory copy, % of the GPU's spec bandwidth
    "p2p_min_pct": 40,  # GPU->GPU copy, % of the slower GPU's link rate
    "allreduce_min_pct": 30,  # NCCL all-reduce busbw, % of the slowest link rate
    "allreduce_min_busbw_gbps": None,  # absolute busbw floor instead (NVLink boxes)
    "min_link_gen": 4,  # a GPU at Gen3 (or below) is a finding
    "min_link_width": 16,  # a GPU at x8 is a finding
    "pcie_replay_max": 100,  # PCIe replays (link-level retransmits) since driver load
    "require_persistence": False,  # persistence mode off: a finding only when required
    "mem_bw_tbs": None,  # the GPU's memory bandwidth spec, for GPUs not in KNOWN_GPUS
    "link_gbps": None,  # per-direction link rate, overriding the PCIe gen x width table
    "python": "python3",  # interpreter in the container (the server's venv has torch)
    "allreduce_sets": None,  # e.g. [[0,1,2,3],[4,5,6,7]]; default: from gpubox_bench.tp
    "timeout_s": 600,
}
_PCT = ("h2d_min_pct", "d2h_min_pct", "d2d_min_pct", "p2p_min_pct", "allreduce_min_pct")
_POS = ("allreduce_min_busbw_gbps", "mem_bw_tbs", "link_gbps", "timeout_s", "pcie_replay_max")

# GB/s per lane and direction after line coding: Gen1/2 8b/10b, Gen3-5 128b/130b, Gen6 FLIT
# (242/256 of 64 GT/s). x16: Gen4 31.5, Gen5 63.0 GB/s (PCI-SIG figures).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Memory bandwidth by product name (vendor datasheets), most specific name first: a name matches
# the first entry it contains ("NVIDIA GH200 480GB" must not be read as an H200).
KNOWN_GPUS: list[tuple[str, float]] = [
    ("GH200", 4.0),
    ("H200", 4.8),  # H200 SXM and NVL, 141 GB HBM3e
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM5 80GB HBM3 ("NVIDIA H100 80GB HBM3")
    ("H800", 3.35),
    ("B200", 8.0),
    ("RTX PRO 6000 Blackwell", 1.792),  # Server, Workstation and Max-Q: 96 GB GDDR7, 512-bit
    ("RTX 6000 Ada", 0.96),
    ("RTX 5090", 1.792),
    ("RTX 4090", 1.008),
    ("L40S", 0.864),
    ("L40", 0.864),
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935),
    ("A100", 1.555),
    ("RTX A6000", 0.768),
]

# NVLink bandwidth per GPU and direction by product name: half the bidirectional total the
# datasheets give (H100 SXM, H200 SXM and NVL, GH200: 900 GB/s; H100 NVL and PCIe with bridges, A100:
# 600; H800: 400; A800: 400; B200: 1.8 TB/s; RTX A6000 bridge: 112.5). Matched like KNOWN_GPUS. GPUs
# without NVLink (L40S, RTX 4090, RTX 6000 Ada, RTX PRO 6000) are absent: nothing to expect.
KNOWN_NVLINK: list[tuple[str, float]] = [
    ("GH200", 450.0),
    ("H200", 450.0),
    ("H100 NVL", 300.0),
    ("H100 PCIe", 300.0),
    ("H100", 450.0),
    ("H800", 200.0),
    ("B200", 900.0),
    ("A800", 200.0),
    ("A100", 300.0),
    ("RTX A6000", 56.25),
]

# Host <-> GPU links other than PCIe: NVLink-C2C of Grace Hopper / Grace Blackwell, 900 GB/s
# bidirectional (datasheets), 450 per direction.
KNOWN_HOST_LINKS: list[tuple[str, float, str]] = [
    ("GH200", 450.0, "NVLink-C2C"),
    ("GB200", 450.0, "NVLink-C2C"),
]


def limits(raw: Any = None, **extra: Any) -> dict[str, Any]:
    """DEFAULTS updated with the inventory's `gpubox_probe` mapping, validated (bad -> exit 2)."""
    out = dict(DEFAULTS)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise GpuboxError(
            f"gpubox_probe must be a mapping, got {type(raw).__name__}",
            "write it as gpubox_probe: {h2d_min_pct: 70, ...}",
        )
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise GpuboxError(
            f"gpubox_probe: unknown key(s) {', '.join(map(str, unknown))}", f"known: {', '.join(DEFAULTS)}"
        )
    out.update(raw)
    out.update({k: v for k, v in extra.items() if v is not None})
    for k in _PCT:
        v = out[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
            raise GpuboxError(f"gpubox_probe.{k} = {v!r} is not a percentage", "use a number from 0 to 100")
    for k in _POS:
        v = out[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise GpuboxError(
                f"gpubox_probe.{k} = {v!r} is not a positive number", "use a number above 0, or remove it"
            )
    if out["min_link_gen"] not in PCIE_LANE_GBPS:
        raise GpuboxError(
            f"gpubox_probe.min_link_gen = {out['min_link_gen']!r} is not a PCIe generation", "use 1 to 6"
        )
    if out["min_link_width"] not in (1, 2, 4, 8, 16, 32):
        raise GpuboxError(
            f"gpubox_probe.min_link_width = {out['min_link_width']!r} is not a PCIe width",
            "use 1, 2, 4, 8, 16 or 32",
        )
    if not isinstance(out["python"], str) or not out["python"].strip():
        raise GpuboxError(
            "gpubox_probe.python must be a command name or path", "e.g. /opt/vllm/.venv/bin/python3"
        )
    sets = out["allreduce_sets"]
    if sets is not None:
        if not isinstance(sets, list) or not all(
            isinstance(s, list)
            and s
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in s)
            for s in sets
        ):
            raise GpuboxError(
                f"gpubox_probe.allreduce_sets = {sets!r} is not a list of GPU index lists",
                "e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]",
            )
    return out


def tp_sets(tp_sizes: Any, ngpus: int | None) -> list[list[int]] | None:
    """TP sizes from the inventory (gpubox_bench.tp) -> contiguous GPU sets of size > 1."""
    if not tp_sizes or not ngpus:
        return None
    out = []
    for tp in tp_sizes:
        try:
            tp = int(tp)
        except (TypeError, ValueError):
            continue
        if 1 < tp <= ngpus:
            out.extend(list(range(s, s + tp)) for s in range(0, ngpus - tp + 1, tp))
    return out


# -- reference rates ----------------------------------------------------------------------------
def link_rate(gen: int | None, width: int | None) -> float | None:
    if not gen or not width or gen not in PCIE_LANE_GBPS:
        return None
    return round(PCIE_LANE_GBPS[gen] * width, 1)


def mem_spec_tbs(name: str | None, override: float | None = None) -> float | None:
    if override:
        return float(override)
    low = (name or "").lower()
    for key, tbs in KNOWN_GPUS:
        if key.lower() in low:
            return tbs
    return None


def _by_name(table, name: str | None):
    low = (name or "").lower()
    for row in table:
        if row[0].lower() in low:
            return row
    return None


def nvlink_spec_gbps(name: str | None) -> float | None:
    """The GPU model's NVLink bandwidth per direction (KNOWN_NVLINK), None when unknown."""
    row = _by_name(KNOWN_NVLINK, name)
    return row[1] if row else None


def host_link_spec(name: str | None) -> tuple[float, str] | None:
    """(GB/s per direction, link name) of a host link other than PCIe (KNOWN_HOST_LINKS)."""
    row = _by_name(KNOWN_HOST_LINKS, name)
    return (row[1], row[2]) if row else None


def expected_link(g: GpuFacts | None, lim: dict[str, Any]) -> tuple[float | None, str]:
    """(GB/s per direction, label) the GPU's link should carry: its gen/width capability here."""
    if lim.get("link_gbps"):
        return float(lim["link_gbps"]), f"{lim['link_gbps']} GB/s (gpubox_probe.link_gbps)"
    if not g:
        return None, "unknown link (no NVML)"
    gen, width = g.pcie.gen_max, g.pcie.width_max
    rate = link_rate(gen, width)
    return rate, f"Gen{gen} x{width} ({rate} GB/s)" if rate else "unknown link"
