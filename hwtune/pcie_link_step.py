"""The pcie-link step: a GPU trained below its link width or speed, read from the facts of
hwtune/pcie.py. It only reports: a link trained below its width needs hands on the machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpubox.steps import OMIT, Finding, Omit, Step

from .pcie import (
    DeviceRegs,
    gather_devices,
)


@dataclass
class LinkFacts:
    devices: list[DeviceRegs] = field(default_factory=list)


@dataclass
class LinkOptions:
    """Nothing to choose: the link is what it trained to."""


@dataclass
class LinkEvidence:
    slow: list[str] | Omit = OMIT  # ok: functions below max speed now (normal at idle)
    links: dict[str, dict[str, Any]] = field(default_factory=dict)


class PcieLinkStep(Step):
    """A GPU trained below its capability is a health finding: nothing to tune, reseat/reboot."""

    name = "pcie-link"
    title = "PCIe link speed/width of GPU functions"
    where = "host"

    def options(self, ctx) -> LinkOptions:
        return LinkOptions()

    def gather(self, ctx) -> LinkFacts:
        return LinkFacts(gather_devices(ctx))

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
