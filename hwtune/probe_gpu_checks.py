"""The probe's verdict on each GPU's facts: NVML itself, the GPU's state (MIG, power cap,
application clocks, persistence), its PCIe link, its memory (ECC, row remapping, page
retirement), its clocks, the NVSwitch fabric and the XID events seen while the probe ran.

Pure functions of the probe document (probe_doc.ProbeDoc), so CI judges documents recorded on
real GPUs (tests/fixtures/probe/).
"""

from __future__ import annotations

from typing import Any

from gpubox.steps import DRIFT, FAILED, OK, SKIPPED

from .probe_check import Check
from .probe_doc import GpuFacts, ProbeDoc

# Clock event reasons that mean the hardware is holding clocks down (nvml.h): not idle, not the
# normal power cap under load.
BAD_CLOCK_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

FABRIC_FIX = (
    "on the host: systemctl status nvidia-fabricmanager (journalctl -u nvidia-fabricmanager); its "
    "package version must equal the driver's (nvidia-smi: Driver Version; 'fabric manager NVIDIA GPU "
    "driver interface version ... don't match' in its log), then systemctl restart nvidia-fabricmanager; "
    "keep the two in step: apt-mark hold the driver and fabric manager packages (gpubox doctor's "
    "driver-packages step names them), so an unattended upgrade cannot move one alone"
)


def _json(rec) -> object:
    """A record of the document as the evidence shows it (None stays None)."""
    return rec.to_json() if rec is not None else None


def check_nvml(doc: ProbeDoc, lim: dict[str, Any], expect_gpus: int | None) -> list[Check]:
    nv = doc.nvml
    if nv.status != "ok":
        status = SKIPPED if nv.status == "skipped" else FAILED
        return [
            Check(
                "nvml",
                status,
                nv.reason or "NVML section missing",
                repair=None if status == SKIPPED else "run the probe by hand with -v",
            )
        ]
    gpus = doc.gpus
    detail = f"driver {nv.driver}, CUDA {nv.cuda_driver}, {len(gpus)} GPU(s): " + ", ".join(
        sorted({str(g.name) for g in gpus})
    )
    ev = {"driver": nv.driver, "cuda_driver": nv.cuda_driver, "gpus": len(gpus)}
    out = []
    km = nv.kernel_module
    if km and nv.driver and km != nv.driver:
        # docs/facts.md "NVIDIA device nodes": a userspace/kernel driver mismatch makes cuInit fail with 803.
        out.append(
            Check(
                "nvml",
                DRIFT,
                f"userspace driver {nv.driver} != kernel module {km}",
                ev,
                cause="the container's NVIDIA libraries do not match the host's kernel module (CUDA error 803)",
                repair="install the host's driver version of the user-space libraries in the container; "
                "where apt installed them, hold them there (apt-mark hold libnvidia-compute-<branch> "
                "...), so an unattended upgrade cannot move them past the host's module again",
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
        if g.error:
            out.append(
                Check(
                    f"{g.label} state",
                    FAILED,
                    f"NVML cannot open the GPU: {g.error}",
                    cause="GPU lost or in a bad state",
                    repair="check the host's kernel log for XIDs; reset or reboot",
                )
            )
    return out


def check_link(doc: ProbeDoc, g: GpuFacts, lim: dict[str, Any]) -> Check:
    name = f"{g.label} link"
    pc = g.pcie
    gen_max, gpu_max = pc.gen_max, pc.gen_gpu_max or pc.gen_max
    w_max = pc.width_max
    if gen_max is None or w_max is None:
        return Check(name, SKIPPED, "NVML does not report the PCIe link here", {"pcie": pc.to_json()})
    loaded = None
    for p in doc.probes:
        if p.name == "h2d" and p.bus_id == g.bus_id and p.link_under_load:
            loaded = p.link_under_load
            break
    idle = "gpu_idle" in g.idle_reasons
    if loaded:
        gen, width, when = loaded.gen, loaded.width, "under load"
    else:
        gen, width, when = pc.gen_current, pc.width_current, "idle" if idle else "now"
    ev = {"pcie": pc.to_json(), "under_load": _json(loaded), "gen": gen, "width": width}
    problems, causes, repairs = [], [], []
    if width is not None and width < w_max:
        problems.append(f"trained at x{width} of x{w_max} {when}")
        causes.append("a badly seated card or riser, or a slot bifurcation setting")
        repairs.append("reseat the GPU/riser, check the BIOS slot width and bifurcation")
    if w_max < lim["min_link_width"]:
        problems.append(f"the slot gives x{w_max}, want x{lim['min_link_width']}")
        causes.append("the GPU sits in a narrow slot or behind an x8 riser")
        repairs.append("move the GPU to an x16 slot")
    if gpu_max and gen_max < gpu_max:
        problems.append(f"slot/BIOS limits it to Gen{gen_max}; the GPU does Gen{gpu_max}")
        causes.append("the BIOS PCIe speed setting, or a riser/retimer rated for a lower gen")
        repairs.append(f"set the slot to Auto/Gen{gpu_max} in the BIOS, or a riser/retimer rated for it")
    if gen is not None and gen < gen_max and (loaded or not idle):
        problems.append(f"ran at Gen{gen} {when}, capable of Gen{gen_max}")
        causes.append("link trained down (signal integrity) or the BIOS caps the speed")
        # a link stuck low is retrained from the port above it (PCIe Link Control bit 5); the
        # host's pcie-link step names that port and whether its target speed holds it down
        repairs.append(
            f"retrain the link from the port above {g.bus_id} on the host (`gpubox doctor` pcie-link "
            "names it and its LnkCtl2 target speed; setpci -s <port> CAP_EXP+10.w=20:20), then "
            "compare LnkSta with LnkCap (lspci -vv); if it trains down again, reseat the GPU and "
            "check the riser/retimer and the BIOS slot speed"
        )
    eff_gen = gen if (loaded or not idle) and gen is not None else gen_max
    if eff_gen < lim["min_link_gen"]:
        problems.append(f"Gen{eff_gen} is below the minimum Gen{lim['min_link_gen']}")
        if not causes:
            causes.append("an old platform or a BIOS speed cap")
            repairs.append("a platform or slot of a newer generation")
    replays = pc.replay_counter
    if replays is not None and replays > lim["pcie_replay_max"]:
        problems.append(f"{replays} PCIe replays (limit {lim['pcie_replay_max']})")
        causes.append("link errors being retried: signal integrity (seating, riser, cable)")
        repairs.append("reseat the GPU, replace the riser/cable")
    cap = f"Gen{gen_max} x{w_max}"
    if problems:
        return Check(
            name,
            DRIFT,
            f"{cap}: " + "; ".join(problems),
            ev,
            cause="; ".join(dict.fromkeys(causes)),
            repair="; ".join(dict.fromkeys(repairs)),
        )
    note = f"Gen{gen} x{width} {when}, capable {cap}"
    if idle and not loaded and gen is not None and gen < gen_max:
        note += " (idle GPUs train the link down to save power; the bandwidth probe reads it under load)"
    if replays is not None:
        note += f", {replays} replays"
    return Check(name, OK, note, ev)


def check_memory(g: GpuFacts) -> Check:
    name = f"{g.label} memory"
    ecc, rr, rp = g.ecc, g.remapped_rows, g.retired_pages
    ev = {"ecc": ecc.to_json(), "remapped_rows": _json(rr), "retired_pages": _json(rp)}
    if rr and rr.failure:
        return Check(
            name,
            FAILED,
            "row remapping failed: no spare rows left",
            ev,
            cause="HBM with more bad rows than spares",
            repair="drain the GPU and replace it (RMA)",
        )
    pending = [w for w, d in (("row remap", rr), ("page retirement", rp)) if d and d.pending]
    if pending:
        return Check(
            name,
            DRIFT,
            f"{' and '.join(pending)} pending",
            ev,
            cause="bad memory found; it is taken out of use only at the next GPU reset",
            repair="when idle: stop the server, `nvidia-smi -r -i <gpu>` on the host (or reboot)",
        )
    unc = ecc.volatile_uncorrected
    if unc:
        return Check(
            name,
            DRIFT,
            f"{unc} uncorrectable ECC error(s) since the driver loaded",
            ev,
            cause="uncorrectable memory errors (XID 48/94/95 class)",
            repair="drain and reset the GPU; replace it if they return",
        )
    parts = ["ECC " + ({True: "on", False: "off", None: "unknown"}[ecc.enabled])]
    if unc is not None:
        parts.append(f"{unc} uncorrectable")
    if rr:
        parts.append(f"remapped rows {rr.correctable or 0} corr/{rr.uncorrectable or 0} unc, none pending")
    elif rp:
        parts.append(f"retired pages {rp.sbe} sbe/{rp.dbe} dbe, none pending")
    return Check(name, OK, ", ".join(parts), ev)


def check_clocks(doc: ProbeDoc, g: GpuFacts) -> Check:
    name = f"{g.label} clocks"
    idle = g.idle_reasons
    load = None
    for p in doc.probes:
        if p.name == "d2d" and p.bus_id == g.bus_id:
            load = p.clock_event_reasons_under_load.active if p.clock_event_reasons_under_load else None
    bad = [r for r in list(idle) + list(load or []) if r in BAD_CLOCK_REASONS]
    temp = g.temperature_c
    ev = {
        "reasons": idle,
        "reasons_under_load": load,
        "temperature_c": temp,
        "clocks_mhz": _json(g.clocks_mhz),
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


def check_state(g: GpuFacts, lim: dict[str, Any]) -> Check:
    name = f"{g.label} state"
    mig, pm = g.mig_mode, g.persistence_mode
    ev: dict[str, object] = {
        "persistence_mode": pm,
        "mig_mode": (mig.to_json() or None) if mig else None,
        "name": g.name,
        "bus_id": g.bus_id,
        "memory_total_mib": g.memory_total_mib,
    }
    if mig and mig.current != mig.pending:
        return Check(
            name,
            DRIFT,
            "a MIG mode change is pending a GPU reset",
            ev,
            cause="MIG was switched without a reset",
            repair="reset the GPU on the host, or switch back",
        )
    if mig and mig.current == 1:
        return Check(
            name,
            DRIFT,
            "MIG is on: the GPU is split into instances",
            ev,
            cause="tensor-parallel serving needs whole GPUs",
            repair="`nvidia-smi -i <gpu> -mig 0` on the host (gpubox only reads it)",
        )
    power = check_power(g, lim.get("expected_power_w"), ev)
    if power is not None:
        return power
    app = g.app_clocks_mhz
    low = (
        [
            f"{k} {now} MHz (default {default_mhz})"
            for k, now, default_mhz in (("sm", app.sm, app.sm_default), ("mem", app.mem, app.mem_default))
            if now is not None and default_mhz is not None and now < default_mhz
        ]
        if app
        else []
    )
    if low and app:
        ev["app_clocks_mhz"] = app.to_json()
        return Check(
            name,
            DRIFT,
            "application clocks below their defaults: " + ", ".join(low),
            ev,
            cause="application clocks were set lower (nvidia-smi -ac): the GPU runs slower under load",
            repair=f"`nvidia-smi -i {g.index} -rac` on the host if not intended (gpubox only reads GPU settings)",
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
    desc = f"{g.name} {g.bus_id}, {g.memory_total_mib} MiB, persistence {persistence}"
    if "expected_power_w" in ev:
        desc += f", power cap {g.power_limit_w:g} W as set (gpubox_expected_power_limit)"
    return Check(name, OK, desc, ev)


POWER_TOLERANCE = 0.01  # NVML reports the enforced limit in mW; nvidia-smi -pl sets whole watts


def check_power(g: GpuFacts, expected: float | None, ev: dict[str, object]) -> Check | None:
    """The GPU's power limit against the box's deliberate cap (`gpubox_expected_power_limit`), else
    against the GPU's default. None when it is as it should be (the state check goes on)."""
    name, cap, default = f"{g.label} state", g.power_limit_w, g.power_default_w
    if not cap:
        return None
    persist = (
        "and set it at every boot (a oneshot unit running that command: the limit goes back to "
        "the default whenever the driver loads)"
    )
    if expected is not None:
        ev.update(power_limit_w=cap, power_default_w=default, expected_power_w=expected)
        if abs(cap - expected) <= max(1.0, POWER_TOLERANCE * expected):
            return None
        higher = cap > expected
        return Check(
            name,
            DRIFT,
            f"power cap {cap:g} W, the box's expected cap is {expected:g} W (gpubox_expected_power_limit)",
            ev,
            cause="the deliberate cap is gone: the driver restores the GPU's default limit at every load "
            "(reboot, driver reload) unless something sets it again, so the headroom it kept (PSU, "
            "heat) is lost"
            if higher
            else "the limit is below the box's deliberate cap: lowered by hand or by another "
            "power-capping service; clocks and tokens/s drop under load",
            repair=f"`nvidia-smi -i {g.index} -pl {expected:g}` on the host, {persist}; or change "
            "gpubox_expected_power_limit if the new cap is meant (gpubox only reads GPU settings)",
        )
    if default and cap < 0.95 * default:
        ev.update(power_limit_w=cap, power_default_w=default)
        return Check(
            name,
            DRIFT,
            f"power cap {cap:g} W is below the GPU's default {default:g} W",
            ev,
            cause="the power limit was lowered (nvidia-smi -pl, a power-capping service): clocks and "
            "tokens/s drop under load",
            repair=f"`nvidia-smi -i {g.index} -pl {default:g}` on the host if the cap is not "
            f"intended; if it is (PSU headroom), set gpubox_expected_power_limit: {cap:g} for the box "
            "(gpubox only reads GPU settings)",
        )
    return None


def check_fabric(doc: ProbeDoc) -> Check | None:
    """NVSwitch fabric state per GPU (NVML GpuFabricInfo). None when the probe read none; OK when
    the GPUs have no NVSwitch fabric (not_supported: a PCIe box, a pass-through VM) or it is up."""
    gpus = [(g, g.fabric) for g in doc.gpus if g.fabric is not None]
    if not gpus:
        return None
    ev = {"fabric": {g.bus_id or str(g.index): f.to_json() for g, f in gpus}}
    states = {f.state for _, f in gpus}
    if states == {"not_supported"}:
        return Check("fabric", OK, "no NVSwitch fabric on these GPUs (NVML: not supported)", ev)
    down = [(g, f) for g, f in gpus if f.state in ("not_started", "in_progress")]
    bad = [(g, f) for g, f in gpus if f.state == "completed" and f.status]
    if down or bad:
        shown = ", ".join(
            f"{g.label} {f.state}" + (f" (status {f.status})" if f.status else "") for g, f in down + bad
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
    degraded = [g for g, f in gpus if (int(f.health_mask or 0) & 0x3) == 1]
    if degraded:
        return Check(
            "fabric",
            DRIFT,
            "NVSwitch fabric up with degraded bandwidth on " + ", ".join(g.label for g in degraded),
            ev,
            cause="an NVLink/NVSwitch link is down or degraded",
            repair="nvidia-smi nvlink --status on the host; check the fabric manager log",
        )
    return Check("fabric", OK, f"NVSwitch fabric completed on {len(gpus)} GPU(s)", ev)


def check_xid(doc: ProbeDoc) -> Check:
    x = doc.xid
    if x.status != "ok":
        return Check("xid", SKIPPED, x.reason or "no XID watch", {"xid": x.to_json()})
    ev = x.events
    if ev:
        shown = ", ".join(f"XID {e.xid} on {e.bus_id}" for e in ev[:5])
        return Check(
            "xid",
            FAILED,
            f"{len(ev)} critical XID event(s) during the probe: {shown}",
            {"xid": x.to_json()},
            cause="the driver reported a GPU error under load",
            repair="look the XID up in NVIDIA's XID catalog; check the host's kernel log (NVRM: Xid)",
        )
    return Check("xid", OK, f"no critical XID in the {x.window_s} s probe window", {"xid": x.to_json()})
