"""Judge a probe document (hwtune/probe.py's JSON) against limits: one check per GPU and path.

The probe runs on the target and only measures; this module runs on the control node, so CI tests
it on output recorded from a real H200 (tests/fixtures/probe/h200_real.json).

Statuses: ok; drift = measurably degraded (a link at x8, copies below the limit, a reset pending);
failed = broken (a probe crashed, a GPU missing, row remapping out of spares); skipped = could not
measure here (no NVML, no GPU, no torch), which is not a problem in itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.steps import DRIFT, FAILED, OK, SKIPPED, RunReport, StepResult

from .links import all_paths, pair_path, ring_reference

REPORT_SCHEMA = "gpubox.probe-report/1"
PROBE_SCHEMA = "gpubox.probe/1"

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

# Clock event reasons that mean the hardware is holding clocks down (nvml.h): not idle, not the
# normal power cap under load.
BAD_CLOCK_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass
class Check:
    name: str
    status: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    repair: str | None = None

    def to_result(self, host: str) -> StepResult:
        return StepResult(
            name=self.name,
            host=host,
            status=self.status,
            detail=self.detail,
            evidence=self.evidence,
            cause=self.cause,
            repair=self.repair,
            title=self.name,
        )


# -- inputs -------------------------------------------------------------------------------------
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


def parse(text: str, source: str = "probe") -> dict[str, Any]:
    """The probe's stdout -> its document; anything else is a one-line error."""
    text = (text or "").strip()
    start = text.find("{")
    try:
        doc = json.loads(text[start:] if start >= 0 else text)
    except ValueError:
        tail = text.splitlines()[-1:] or ["(no output)"]
        raise GpuboxError(
            f"{source} did not print probe JSON: {tail[0][:200]}",
            "run it by hand with -v, or check the interpreter (gpubox_probe.python)",
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
        raise GpuboxError(
            f"{source} is not a {PROBE_SCHEMA} document", "give the JSON that hwtune/probe.py printed"
        )
    return doc


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


# -- facts --------------------------------------------------------------------------------------
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


def _gpus(doc: dict) -> list[dict]:
    nv = doc.get("nvml") or {}
    return [g for g in nv.get("gpus") or [] if isinstance(g, dict)]


def _probes(doc: dict) -> list[dict]:
    bw = doc.get("bandwidth") or {}
    return [p for p in bw.get("probes") or [] if isinstance(p, dict)]


def _nvml_gpu_for(doc: dict, bus_id: str | None, index: int | None) -> dict | None:
    gpus = _gpus(doc)
    for g in gpus:
        if bus_id and g.get("bus_id") == bus_id:
            return g
    if bus_id is None and index is not None and index < len(gpus):
        return gpus[index]
    return None


def _label(g: dict) -> str:
    return f"gpu{g.get('index')}"


def _torch_label(doc: dict, p: dict, key: str = "gpu") -> str:
    g = _nvml_gpu_for(doc, p.get("bus_id"), p.get(key))
    return _label(g) if g else f"cuda{p.get(key)}"


def expected_link(g: dict | None, lim: dict) -> tuple[float | None, str]:
    """(GB/s per direction, label) the GPU's link should carry: its gen/width capability here."""
    if lim.get("link_gbps"):
        return float(lim["link_gbps"]), f"{lim['link_gbps']} GB/s (gpubox_probe.link_gbps)"
    if not g:
        return None, "unknown link (no NVML)"
    pc = g.get("pcie") or {}
    gen, width = pc.get("gen_max"), pc.get("width_max")
    rate = link_rate(gen, width)
    return rate, f"Gen{gen} x{width} ({rate} GB/s)" if rate else "unknown link"


# -- checks -------------------------------------------------------------------------------------
def check_nvml(doc: dict, lim: dict, expect_gpus: int | None) -> list[Check]:
    nv = doc.get("nvml") or {}
    st = nv.get("status")
    if st != "ok":
        status = SKIPPED if st == "skipped" else FAILED
        return [
            Check(
                "nvml",
                status,
                nv.get("reason") or "NVML section missing",
                repair=None if status == SKIPPED else "run the probe by hand with -v",
            )
        ]
    gpus = _gpus(doc)
    detail = f"driver {nv.get('driver')}, CUDA {nv.get('cuda_driver')}, {len(gpus)} GPU(s): " + ", ".join(
        sorted({str(g.get("name")) for g in gpus})
    )
    ev = {"driver": nv.get("driver"), "cuda_driver": nv.get("cuda_driver"), "gpus": len(gpus)}
    out = []
    km = nv.get("kernel_module")
    if km and nv.get("driver") and km != nv.get("driver"):
        # docs/facts.md "NVIDIA device nodes": a userspace/kernel driver mismatch makes cuInit fail with 803.
        out.append(
            Check(
                "nvml",
                DRIFT,
                f"userspace driver {nv.get('driver')} != kernel module {km}",
                ev,
                cause="the container's NVIDIA libraries do not match the host's kernel module (CUDA error 803)",
                repair="install the host's driver version of the user-space libraries in the container",
            )
        )
    elif expect_gpus and len(gpus) < expect_gpus:
        out.append(
            Check(
                "nvml",
                FAILED,
                f"NVML sees {len(gpus)} GPU(s), the inventory says {expect_gpus}",
                ev,
                cause="a GPU is not passed to the container, or fell off the bus (XID 79)",
                repair="check `nvidia-smi -L` on the host and the container's device entries",
            )
        )
    else:
        out.append(Check("nvml", OK, detail, ev))
    for g in gpus:
        if g.get("error"):
            out.append(
                Check(
                    f"gpu{g.get('index')} state",
                    FAILED,
                    f"NVML cannot open the GPU: {g['error']}",
                    cause="GPU lost or in a bad state",
                    repair="check the host's kernel log for XIDs; reset or reboot",
                )
            )
    return out


def check_link(doc: dict, g: dict, lim: dict) -> Check:
    name = f"{_label(g)} link"
    pc = g.get("pcie") or {}
    gen_max, gpu_max = pc.get("gen_max"), pc.get("gen_gpu_max") or pc.get("gen_max")
    w_max = pc.get("width_max")
    if gen_max is None or w_max is None:
        return Check(name, SKIPPED, "NVML does not report the PCIe link here", {"pcie": pc})
    loaded = None
    for p in _probes(doc):
        if p.get("name") == "h2d" and p.get("bus_id") == g.get("bus_id") and p.get("link_under_load"):
            loaded = p["link_under_load"]
            break
    idle = "gpu_idle" in ((g.get("clock_event_reasons") or {}).get("active") or [])
    if loaded:
        gen, width, when = loaded.get("gen"), loaded.get("width"), "under load"
    else:
        gen, width, when = pc.get("gen_current"), pc.get("width_current"), "idle" if idle else "now"
    ev = {"pcie": pc, "under_load": loaded, "gen": gen, "width": width}
    problems, causes = [], []
    if width is not None and width < w_max:
        problems.append(f"trained at x{width} of x{w_max} {when}")
        causes.append("a badly seated card or riser, or a slot bifurcation setting")
    if w_max < lim["min_link_width"]:
        problems.append(f"the slot gives x{w_max}, want x{lim['min_link_width']}")
        causes.append("the GPU sits in a narrow slot or behind an x8 riser")
    if gpu_max and gen_max < gpu_max:
        problems.append(f"slot/BIOS limits it to Gen{gen_max}; the GPU does Gen{gpu_max}")
        causes.append("the BIOS PCIe speed setting, or a riser/retimer rated for a lower gen")
    if gen is not None and gen < gen_max and (loaded or not idle):
        problems.append(f"ran at Gen{gen} {when}, capable of Gen{gen_max}")
        causes.append("link trained down (signal integrity) or the BIOS caps the speed")
    eff_gen = gen if (loaded or not idle) and gen is not None else gen_max
    if eff_gen < lim["min_link_gen"]:
        problems.append(f"Gen{eff_gen} is below the minimum Gen{lim['min_link_gen']}")
        if not causes:
            causes.append("an old platform or a BIOS speed cap")
    replays = pc.get("replay_counter")
    if replays is not None and replays > lim["pcie_replay_max"]:
        problems.append(f"{replays} PCIe replays (limit {lim['pcie_replay_max']})")
        causes.append("link errors being retried: signal integrity (seating, riser, cable)")
    cap = f"Gen{gen_max} x{w_max}"
    if problems:
        return Check(
            name,
            DRIFT,
            f"{cap}: " + "; ".join(problems),
            ev,
            cause="; ".join(dict.fromkeys(causes)),
            repair="reseat the GPU/riser, check the BIOS slot speed and bifurcation, "
            "compare `lspci -vv` LnkCap/LnkSta on the host",
        )
    note = f"Gen{gen} x{width} {when}, capable {cap}"
    if idle and not loaded and gen is not None and gen < gen_max:
        note += " (idle GPUs train the link down to save power; the bandwidth probe reads it under load)"
    if replays is not None:
        note += f", {replays} replays"
    return Check(name, OK, note, ev)


def check_memory(g: dict) -> Check:
    name = f"{_label(g)} memory"
    ecc, rr, rp = g.get("ecc") or {}, g.get("remapped_rows"), g.get("retired_pages")
    ev = {"ecc": ecc, "remapped_rows": rr, "retired_pages": rp}
    if rr and rr.get("failure"):
        return Check(
            name,
            FAILED,
            "row remapping failed: no spare rows left",
            ev,
            cause="HBM with more bad rows than spares",
            repair="drain the GPU and replace it (RMA)",
        )
    pending = [w for w, d in (("row remap", rr), ("page retirement", rp)) if d and d.get("pending")]
    if pending:
        return Check(
            name,
            DRIFT,
            f"{' and '.join(pending)} pending",
            ev,
            cause="bad memory found; it is taken out of use only at the next GPU reset",
            repair="when idle: stop the server, `nvidia-smi -r -i <gpu>` on the host (or reboot)",
        )
    unc = ecc.get("volatile_uncorrected")
    if unc:
        return Check(
            name,
            DRIFT,
            f"{unc} uncorrectable ECC error(s) since the driver loaded",
            ev,
            cause="uncorrectable memory errors (XID 48/94/95 class)",
            repair="drain and reset the GPU; replace it if they return",
        )
    parts = ["ECC " + ({True: "on", False: "off", None: "unknown"}[ecc.get("enabled")])]
    if unc is not None:
        parts.append(f"{unc} uncorrectable")
    if rr:
        parts.append(
            f"remapped rows {rr.get('correctable', 0)} corr/{rr.get('uncorrectable', 0)} unc, none pending"
        )
    elif rp:
        parts.append(f"retired pages {rp.get('sbe')} sbe/{rp.get('dbe')} dbe, none pending")
    return Check(name, OK, ", ".join(parts), ev)


def check_clocks(doc: dict, g: dict) -> Check:
    name = f"{_label(g)} clocks"
    idle = (g.get("clock_event_reasons") or {}).get("active") or []
    load = None
    for p in _probes(doc):
        if p.get("name") == "d2d" and p.get("bus_id") == g.get("bus_id"):
            load = (p.get("clock_event_reasons_under_load") or {}).get("active")
    bad = [r for r in list(idle) + list(load or []) if r in BAD_CLOCK_REASONS]
    temp = g.get("temperature_c")
    ev = {
        "reasons": idle,
        "reasons_under_load": load,
        "temperature_c": temp,
        "clocks_mhz": g.get("clocks_mhz"),
    }
    if bad:
        return Check(
            name,
            DRIFT,
            "clocks held down: "
            + ", ".join(dict.fromkeys(bad))
            + (f" at {temp} C" if temp is not None else ""),
            ev,
            cause="overheating, a PSU power brake or a hardware slowdown signal",
            repair="check fans/airflow and power; `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` on the host",
        )
    shown = ", ".join(idle) or "none"
    tail = f"; under load: {', '.join(load) or 'none'}" if load is not None else ""
    return Check(name, OK, f"reasons: {shown}{tail}" + (f", {temp} C" if temp is not None else ""), ev)


def check_state(g: dict, lim: dict) -> Check:
    name = f"{_label(g)} state"
    mig, pm = g.get("mig_mode") or {}, g.get("persistence_mode")
    ev = {
        "persistence_mode": pm,
        "mig_mode": mig or None,
        "name": g.get("name"),
        "bus_id": g.get("bus_id"),
        "memory_total_mib": g.get("memory_total_mib"),
    }
    if mig and mig.get("current") != mig.get("pending"):
        return Check(
            name,
            DRIFT,
            "a MIG mode change is pending a GPU reset",
            ev,
            cause="MIG was switched without a reset",
            repair="reset the GPU on the host, or switch back",
        )
    if mig.get("current") == 1:
        return Check(
            name,
            DRIFT,
            "MIG is on: the GPU is split into instances",
            ev,
            cause="tensor-parallel serving needs whole GPUs",
            repair="`nvidia-smi -i <gpu> -mig 0` on the host (gpubox only reads it)",
        )
    cap, default = g.get("power_limit_w"), g.get("power_default_w")
    if cap and default and cap < 0.95 * default:
        ev.update(power_limit_w=cap, power_default_w=default)
        return Check(
            name,
            DRIFT,
            f"power cap {cap:g} W is below the GPU's default {default:g} W",
            ev,
            cause="the power limit was lowered (nvidia-smi -pl, a power-capping service): clocks and "
            "tokens/s drop under load",
            repair=f"`nvidia-smi -i {g.get('index')} -pl {default:g}` on the host if the cap is not "
            "intended (gpubox only reads GPU settings)",
        )
    app = g.get("app_clocks_mhz") or {}
    low = [
        f"{k} {app[k]} MHz (default {app[k + '_default']})"
        for k in ("sm", "mem")
        if isinstance(app.get(k), int)
        and isinstance(app.get(k + "_default"), int)
        and app[k] < app[k + "_default"]
    ]
    if low:
        ev["app_clocks_mhz"] = app
        return Check(
            name,
            DRIFT,
            "application clocks below their defaults: " + ", ".join(low),
            ev,
            cause="application clocks were set lower (nvidia-smi -ac): the GPU runs slower under load",
            repair=f"`nvidia-smi -i {g.get('index')} -rac` on the host if not intended (gpubox only reads GPU settings)",
        )
    if pm is False and lim["require_persistence"]:
        return Check(
            name,
            DRIFT,
            "persistence mode off",
            ev,
            cause="the driver tears the GPU down when idle: slow first CUDA start",
            repair="enable nvidia-persistenced on the host",
        )
    persistence = "on" if pm else "off" if pm is False else "?"
    desc = f"{g.get('name')} {g.get('bus_id')}, {g.get('memory_total_mib')} MiB, persistence {persistence}"
    return Check(name, OK, desc, ev)


def _pct_check(
    name: str,
    value: float,
    ref: float | None,
    ref_label: str,
    min_pct: float,
    unit: str,
    ev: dict,
    what: str,
    cause: str,
    repair: str,
    scale: float = 1.0,
) -> Check:
    shown = f"{value / scale:.2f} {unit}" if scale != 1.0 else f"{value:.1f} {unit}"
    if not ref:
        return Check(
            name,
            SKIPPED,
            f"{shown}; no reference to judge against ({ref_label})",
            ev,
            repair="set gpubox_probe.mem_bw_tbs or link_gbps for this GPU",
        )
    pct = 100.0 * value / ref
    ev.update(value=value, reference=ref, pct=round(pct, 1), min_pct=min_pct)
    detail = f"{shown} = {pct:.0f}% of {ref_label}, min {min_pct:g}%"
    if pct < min_pct:
        return Check(name, DRIFT, f"{what} {detail}", ev, cause=cause, repair=repair)
    return Check(name, OK, detail, ev)


def check_bandwidth(doc: dict, lim: dict) -> list[Check]:
    """One check per bandwidth probe, each judged by its own pass against its reference: the
    link's rate (host copies), the memory spec (device copies), the pair's path (P2P), the ring's
    slowest hop or a floor (all-reduce)."""
    bw = doc.get("bandwidth") or {}
    if bw.get("status") != "ok":
        status = SKIPPED if bw.get("status") == "skipped" else FAILED
        return [Check("bandwidth", status, bw.get("reason") or "no bandwidth section")]
    passes = {"h2d": _check_host_copy, "d2h": _check_host_copy, "d2d": _check_device_copy}
    passes.update(p2p=_check_p2p, allreduce=_check_allreduce)
    out: list[Check] = []
    for p in _probes(doc):
        judge_probe = passes.get(p.get("name"))
        if judge_probe is None:
            continue
        label = _probe_label(doc, p)
        if p.get("status") != "ok":
            out.append(_not_run(label, p))
        else:
            out.append(judge_probe(doc, p, lim, label, {"probe": p}))
    return out


def _probe_label(doc: dict, p: dict) -> str:
    kind = p.get("name")
    if kind == "p2p":
        a = _torch_label(doc, {"gpu": p.get("src"), "bus_id": _bus(doc, p.get("src"))})
        b = _torch_label(doc, {"gpu": p.get("dst"), "bus_id": _bus(doc, p.get("dst"))})
        return f"p2p {a}->{b}"
    if kind == "allreduce":
        return "allreduce " + ",".join(map(str, p.get("gpus") or []))
    return f"{_torch_label(doc, p)} {kind}"


def _not_run(label: str, p: dict) -> Check:
    st = SKIPPED if p.get("status") == "skipped" else FAILED
    return Check(
        label,
        st,
        p.get("reason") or "probe did not run",
        {"probe": p},
        repair=None
        if st == SKIPPED
        else "run `gpubox probe -v` on the box; check the server is not holding the GPU memory",
    )


def _check_host_copy(doc: dict, p: dict, lim: dict, label: str, ev: dict) -> Check:
    """h2d / d2h against the GPU's link rate."""
    kind = p["name"]
    g = _nvml_gpu_for(doc, p.get("bus_id"), p.get("gpu"))
    ref, ref_label = expected_link(g, lim)
    return _pct_check(
        label,
        p["gbps"],
        ref,
        ref_label,
        lim[f"{kind}_min_pct"],
        "GB/s",
        ev,
        f"{kind.upper()} slow:",
        "link trained down, non-pinned/NUMA-remote host memory, or IOMMU translation",
        "check the link check above, `nvidia-smi topo -m` NUMA affinity, iommu=pt",
    )


def _check_device_copy(doc: dict, p: dict, lim: dict, label: str, ev: dict) -> Check:
    """d2d against the GPU model's memory bandwidth spec."""
    g = _nvml_gpu_for(doc, p.get("bus_id"), p.get("gpu"))
    tbs = mem_spec_tbs((g or {}).get("name"), lim.get("mem_bw_tbs"))
    ref = tbs * 1000 if tbs else None
    gname = (g or {}).get("name") or "unknown GPU"
    return _pct_check(
        label,
        p["gbps"],
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


def _check_p2p(doc: dict, p: dict, lim: dict, label: str, ev: dict) -> Check:
    """A GPU pair against its path (NVLink figures, else the slower of the two links); a pair
    without peer access is drift whatever it measured."""
    if p.get("src") == p.get("dst"):
        return Check(
            label, SKIPPED, f"same GPU ({p['gbps']:.1f} GB/s): a code-path exercise, not a P2P figure", ev
        )
    path = pair_path(doc, min(p["src"], p["dst"]), max(p["src"], p["dst"])) if _has_index(doc, p) else None
    if path is None or (path.kind == "pcie" and lim.get("link_gbps")):
        rates = [
            expected_link(_nvml_gpu_for(doc, _bus(doc, i), i), lim)[0] for i in (p.get("src"), p.get("dst"))
        ]
        ref = min(rates) if all(rates) else None
        ref_label = f"link {ref} GB/s" if ref else "unknown link"
    else:
        ref, ref_label = path.gbps, path.label
        ev["path"] = path.to_dict()
    ev["peer_access"] = p.get("peer_access")
    if p.get("peer_access") is False:
        return Check(
            label,
            DRIFT,
            f"{p['gbps']:.1f} GB/s without peer access (staged through host memory)",
            ev,
            cause="P2P is off between these GPUs: IOMMU/ACS on the PCIe path, or not supported",
            repair="check ACS/IOMMU settings (iommu=pt, ACS off on the switches); NCCL_P2P_LEVEL",
        )
    return _pct_check(
        label,
        p["gbps"],
        ref,
        ref_label,
        lim["p2p_min_pct"],
        "GB/s",
        ev,
        "P2P slow:",
        "an NVLink down or trained slower, or the pair crosses the CPU interconnect (SYS)",
        "see `nvidia-smi nvlink --status` and `nvidia-smi topo -m`; keep TP groups on one NUMA node",
    )


def _check_allreduce(doc: dict, p: dict, lim: dict, label: str, ev: dict) -> Check:
    """NCCL all-reduce bus bandwidth against a configured floor, else the ring's slowest hop."""
    gpus = p.get("gpus") or []
    if len(gpus) < 2:
        return Check(
            label, SKIPPED, f"one rank moves no bus traffic (NCCL ran: algbw {p.get('algbw_gbps')} GB/s)", ev
        )
    busbw = p.get("busbw_gbps") or 0.0
    if lim.get("allreduce_min_busbw_gbps"):
        floor = float(lim["allreduce_min_busbw_gbps"])
        detail = f"busbw {busbw:.1f} GB/s (algbw {p.get('algbw_gbps')}), min {floor:g} GB/s"
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
    hop = ring_reference(doc, list(gpus)) if all(_has_index(doc, {"src": i}) for i in gpus) else None
    if hop is not None and hop.gbps and not (hop.kind == "pcie" and lim.get("link_gbps")):
        ref, ref_label = hop.gbps, f"slowest hop {hop.a}-{hop.b}: {hop.label}"
        ev["path"] = hop.to_dict()
    else:
        rates = [expected_link(_nvml_gpu_for(doc, _bus(doc, i), i), lim)[0] for i in gpus]
        ref = min(rates) if rates and all(rates) else None
        ref_label = f"link {ref} GB/s" if ref else "unknown link"
    return _pct_check(
        label,
        busbw,
        ref,
        ref_label,
        lim["allreduce_min_pct"],
        "GB/s busbw",
        ev,
        "all-reduce slow:",
        "NCCL transport or topology (P2P off, cross-NUMA ring, wrong NCCL env)",
        "check the NCCL profile (gpubox nccl) and the P2P checks",
    )


def _has_index(doc: dict, p: dict) -> bool:
    """The torch index maps to the NVML record of the same index (bus ids agree, or none recorded)."""
    for i in (p.get("src"), p.get("dst")):
        if i is None:
            continue
        g = _nvml_gpu_for(doc, _bus(doc, i), i)
        if g is None or g.get("index") != i:
            return False
    return True


def check_paths(doc: dict) -> list[Check]:
    """One row per GPU pair with NVLink anywhere on the box: the path, and links down or slower
    than the siblings (a degraded NVLink that sends traffic over PCIe)."""
    if not any((g.get("nvlink") or {}).get("links") for g in _gpus(doc)):
        return []
    out = []
    for path in all_paths(doc):
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


def _bus(doc: dict, torch_index: int | None) -> str | None:
    ids = (doc.get("bandwidth") or {}).get("gpu_bus_ids") or []
    if torch_index is not None and 0 <= torch_index < len(ids):
        return ids[torch_index]
    return None


def check_xid(doc: dict) -> Check:
    x = doc.get("xid") or {}
    if x.get("status") != "ok":
        return Check("xid", SKIPPED, x.get("reason") or "no XID watch", {"xid": x})
    ev = x.get("events") or []
    if ev:
        shown = ", ".join(f"XID {e.get('xid')} on {e.get('bus_id')}" for e in ev[:5])
        return Check(
            "xid",
            FAILED,
            f"{len(ev)} critical XID event(s) during the probe: {shown}",
            {"xid": x},
            cause="the driver reported a GPU error under load",
            repair="look the XID up in NVIDIA's XID catalog; check the host's kernel log (NVRM: Xid)",
        )
    return Check("xid", OK, f"no critical XID in the {x.get('window_s')} s probe window", {"xid": x})


def judge(doc: dict, lim: dict | None = None, *, expect_gpus: int | None = None) -> list[Check]:
    lim = lim or limits()
    out = check_nvml(doc, lim, expect_gpus)
    for g in _gpus(doc):
        if g.get("error"):
            continue
        out += [check_state(g, lim), check_link(doc, g, lim), check_memory(g), check_clocks(doc, g)]
    fabric = check_fabric(doc)
    if fabric is not None:
        out.append(fabric)
    out += check_paths(doc)
    out += check_bandwidth(doc, lim)
    out.append(check_xid(doc))
    return out


FABRIC_FIX = (
    "on the host: systemctl status nvidia-fabricmanager (journalctl -u nvidia-fabricmanager); its "
    "package version must equal the driver's (nvidia-smi: Driver Version; 'fabric manager NVIDIA GPU "
    "driver interface version ... don't match' in its log), then systemctl restart nvidia-fabricmanager"
)


def check_fabric(doc: dict) -> Check | None:
    """NVSwitch fabric state per GPU (NVML GpuFabricInfo). None when the probe read none; OK when
    the GPUs have no NVSwitch fabric (not_supported: a PCIe box, a pass-through VM) or it is up."""
    gpus = [g for g in _gpus(doc) if isinstance(g.get("fabric"), dict)]
    if not gpus:
        return None
    ev = {"fabric": {g.get("bus_id") or str(g.get("index")): g["fabric"] for g in gpus}}
    states = {g["fabric"].get("state") for g in gpus}
    if states == {"not_supported"}:
        return Check("fabric", OK, "no NVSwitch fabric on these GPUs (NVML: not supported)", ev)
    down = [g for g in gpus if g["fabric"].get("state") in ("not_started", "in_progress")]
    bad = [g for g in gpus if g["fabric"].get("state") == "completed" and g["fabric"].get("status")]
    if down or bad:
        shown = ", ".join(
            f"{_label(g)} {g['fabric'].get('state')}"
            + (f" (status {g['fabric'].get('status')})" if g["fabric"].get("status") else "")
            for g in down + bad
        )
        return Check(
            "fabric",
            FAILED,
            f"NVSwitch fabric not ready: {shown}",
            ev,
            cause="the fabric manager is not running on the host, or not of the driver's version: CUDA "
            "fails with 802 (system not yet initialized)",
            repair=FABRIC_FIX,
        )
    degraded = [g for g in gpus if (int(g["fabric"].get("health_mask") or 0) & 0x3) == 1]
    if degraded:
        return Check(
            "fabric",
            DRIFT,
            "NVSwitch fabric up with degraded bandwidth on " + ", ".join(_label(g) for g in degraded),
            ev,
            cause="an NVLink/NVSwitch link is down or degraded",
            repair="nvidia-smi nvlink --status on the host; check the fabric manager log",
        )
    return Check("fabric", OK, f"NVSwitch fabric completed on {len(gpus)} GPU(s)", ev)


def gpu_table(doc: dict, lim: dict | None = None) -> list[dict[str, Any]]:
    """One row of headline figures per GPU, for people (and the report's `gpus`)."""
    lim = lim or limits()
    rows = []
    probes = _probes(doc)
    for g in _gpus(doc):
        if g.get("error"):
            continue
        pc = g.get("pcie") or {}
        ref, _ = expected_link(g, lim)
        row = {
            "gpu": g.get("index"),
            "name": g.get("name"),
            "bus_id": g.get("bus_id"),
            "link": f"Gen{pc.get('gen_current')} x{pc.get('width_current')} / Gen{pc.get('gen_max')} x{pc.get('width_max')}",
            "link_gbps": ref,
        }
        for p in probes:
            if (
                p.get("bus_id") == g.get("bus_id")
                and p.get("status") == "ok"
                and p.get("name") in ("h2d", "d2h", "d2d")
            ):
                row[f"{p['name']}_gbps"] = p.get("gbps")
                if p["name"] == "h2d" and p.get("link_under_load"):
                    lu = p["link_under_load"]
                    row["link"] = (
                        f"Gen{lu.get('gen')} x{lu.get('width')} / Gen{pc.get('gen_max')} x{pc.get('width_max')}"
                    )
        tbs = mem_spec_tbs(g.get("name"), lim.get("mem_bw_tbs"))
        row["mem_spec_gbps"] = tbs * 1000 if tbs else None
        rows.append(row)
    return rows


def report(
    doc: dict, lim: dict | None = None, *, box: str = "-", host: str = "-", expect_gpus: int | None = None
) -> RunReport:
    """The probe as a RunReport: one row per check; the raw document travels along for machines."""
    lim = lim or limits()
    checks = judge(doc, lim, expect_gpus=expect_gpus)
    rep = RunReport(box=box, mode="check", steps=[c.to_result(host) for c in checks])
    rep.seconds = float(doc.get("seconds") or 0.0)
    rep.extra = {
        "schema": REPORT_SCHEMA,
        "gpus": gpu_table(doc, lim),
        "thresholds": {k: v for k, v in lim.items() if k not in ("python", "timeout_s")},
        "probe": doc,
    }
    return rep


def summarize(checks: list[Check]) -> tuple[str, str, dict[str, Any]]:
    """(status, one-line detail, evidence) for a doctor/recover step: worst status wins."""
    bad = [c for c in checks if c.status in (DRIFT, FAILED)]
    if bad:
        st = FAILED if any(c.status == FAILED for c in bad) else DRIFT
        return (
            st,
            "; ".join(f"{c.name}: {c.detail}" for c in bad[:3])
            + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""),
            {"problems": [c.name for c in bad]},
        )
    ran = [c for c in checks if c.status == OK]
    if not ran:
        why = "; ".join(dict.fromkeys(c.detail for c in checks if c.status == SKIPPED))
        return SKIPPED, why or "nothing to probe", {}
    skipped = [c.name for c in checks if c.status == SKIPPED]
    return (
        OK,
        f"{len(ran)} checks ok" + (f", {len(skipped)} skipped" if skipped else ""),
        {"skipped": skipped},
    )
