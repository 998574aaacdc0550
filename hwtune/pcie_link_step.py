"""The pcie-link step: a GPU trained below its link width or speed, read from the facts of
hwtune/pcie.py. It only reports: a link trained below its width needs hands on the machine.

Speed is judged against what can hold it down, not only against the capability: a GPU lowers its
link speed by itself when idle, so a slow link alone is no finding here (gpu-probe reads it under
load). Two register bits make a slow link stay slow whatever the load, and both are read:

- the Target Link Speed of the port above the GPU (its LnkCtl2 bits 3:0): for a downstream port
  it is the upper limit of the link's speed (PCIe base spec, Link Control 2). A BIOS slot-speed
  setting writes it, and so does Linux when a link fails to train (drivers/pci/quirks.c
  pcie_failed_link_retrain clamps it to 2.5GT/s; tenstorrent/tt-kmd#197 works around exactly
  that by raising it and retraining);
- Hardware Autonomous Speed Disable on the GPU (its LnkCtl2 bit 5): set to stop a GPU's idle
  speed flapping, it also stops the link from climbing back (local-inference-lab/rtx6kpro#88: a
  GPU left "at Gen2 x16 for three and a half hours of production training").

The repair is a retrain from the port (LnkCtl bit 5, Retrain Link), after the cap is lifted:
reported with the setpci commands, never written by gpubox (the port is not a GPU function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpubox.steps import OMIT, Finding, Omit, Step

from .pcie import (
    HASD_BIT,
    BridgeBuses,
    DeviceRegs,
    PciFunctions,
    device_regs,
    gather_devices,
    upstream_port,
)

RETRAIN = "CAP_EXP+10.w=20:20"  # Link Control bit 5, Retrain Link (masked: nothing else moves)


@dataclass
class LinkFacts:
    devices: list[DeviceRegs] = field(default_factory=list)
    ports: dict[str, DeviceRegs] = field(default_factory=dict)  # GPU bus id -> the port above it


@dataclass
class LinkOptions:
    """Nothing to choose: the link is what it trained to."""


@dataclass
class LinkEvidence:
    slow: list[str] | Omit = OMIT  # ok: functions below max speed now (normal at idle)
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    held: dict[str, str] | Omit = OMIT  # bus id -> what holds its speed down (port target, HASD)


def held_down(d: DeviceRegs, port: DeviceRegs | None) -> tuple[str, str, str] | None:
    """Pure: (detail, cause, repair) when a register keeps this GPU's link below the speed both
    ends support; None when nothing does (a slow link is then the GPU's own idle choice)."""
    if d.devctl is None or d.lnkcap is None or d.lnksta is None:
        return None
    gen, width, cap = d.lnksta & 0xF, (d.lnksta >> 4) & 0x3F, d.lnkcap & 0xF
    if port is not None and port.lnkcap is not None:
        cap = min(cap, port.lnkcap & 0xF)
    if gen >= cap:
        return None
    at = f"{d.bdf} at Gen{gen} x{width}, both ends do Gen{cap}"
    above = port.bdf if port is not None else None
    retrain = (
        f"setpci -s {above} {RETRAIN}" if above else f"setpci -s <the port above {d.bdf}, lspci -t> {RETRAIN}"
    )
    check = f"then read /sys/bus/pci/devices/{d.bdf}/current_link_speed (or lspci -vv LnkSta) again"
    target = (port.lnkctl2 & 0xF) if port is not None and port.lnkctl2 is not None else 0
    if 0 < target < cap and gen <= target:
        return (
            f"{at}: the port above it ({above}) targets Gen{target} (LnkCtl2 Target Link Speed)",
            f"the link's target speed is set below what both ends support (a BIOS slot speed setting, "
            f"or Linux lowering it after a failed link training): it cannot train above Gen{target}",
            f"set the slot to Auto/Gen{cap} in the BIOS; or now, on the host: setpci -s {above} "
            f"CAP_EXP+30.w={cap:x}:f (Target Link Speed), then retrain: {retrain}; {check}; "
            "gpubox does not write a port's registers",
        )
    if d.lnkctl2 is not None and d.lnkctl2 & HASD_BIT:
        return (
            f"{at}: Hardware Autonomous Speed Disable is set on the GPU (LnkCtl2 bit 5)",
            "speed changes are disabled on the GPU (set to stop idle link-speed flapping) while its "
            "link trained low: it stays at this speed under load too",
            f"on the host: clear it, setpci -s {d.bdf} CAP_EXP+30.w=0:20, and retrain: {retrain}; "
            f"{check}; if it falls back again, reseat the GPU and check the riser and the slot",
        )
    return None


class PcieLinkStep(Step):
    """A GPU trained below its capability is a health finding: nothing to tune, reseat/reboot."""

    name = "pcie-link"
    title = "PCIe link speed/width of GPU functions"
    where = "host"

    def options(self, ctx) -> LinkOptions:
        return LinkOptions()

    def gather(self, ctx) -> LinkFacts:
        facts = LinkFacts(gather_devices(ctx))
        slow = [
            d
            for d in facts.devices
            if d.devctl is not None and d.lnksta is not None and (d.lnksta & 0xF) < (d.lnkcap or 0) & 0xF
        ]
        if slow:  # only a slow link needs the port above it (its target speed)
            bridges = ctx.fact(BridgeBuses)
            funcs = {f.bdf: f for f in ctx.fact(PciFunctions)}
            for d in slow:
                port = upstream_port(bridges, d.bdf)
                if port in funcs:
                    regs = device_regs(ctx.fact, funcs[port])
                    if regs.devctl is not None:
                        facts.ports[d.bdf] = regs
        return facts

    def decide(self, facts: LinkFacts, opts: LinkOptions) -> Finding:
        states = [s for s in (d.state() for d in facts.devices) if s.devctl is not None]
        links = {s.bdf: s.link for s in states}
        narrow = [s for s in states if s.link["width"] < s.link["cap_width"]]
        slow = [s for s in states if s.link["gen"] < s.link["cap_gen"] and s not in narrow]
        if narrow:
            return Finding.failed(
                "; ".join(f"{s.bdf} trained at {s.link['now']}, capable of {s.link['cap']}" for s in narrow),
                cause="link trained below its width (riser/slot/cable, bifurcation setting)",
                repair="reseat or move the GPU, check BIOS slot width/bifurcation, then reboot; not tunable",
                evidence=LinkEvidence(links=links),
            )
        held = [(d.bdf, h) for d in facts.devices if (h := held_down(d, facts.ports.get(d.bdf)))]
        if held:
            return Finding.failed(
                "; ".join(h[0] for _, h in held),
                cause=held[0][1][1],
                repair=" -- ".join(h[2] for _, h in held),
                evidence=LinkEvidence(links=links, held={b: h[1] for b, h in held}),
            )
        detail = f"{len(states)} link(s) at full width"
        if states and len({s.link["now"] for s in states}) == 1:
            detail += f" ({states[0].link['now']})"
        if slow:
            # GPUs drop link speed at idle to save power; only width is conclusive without load.
            detail += (
                "; below max speed now: "
                + ", ".join(f"{s.bdf} {s.link['now']} (max {s.link['cap']})" for s in slow)
                + " -- normal at idle, re-check under load"
            )
        return Finding.ok(detail, evidence=LinkEvidence([s.bdf for s in slow], links))
