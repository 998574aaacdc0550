"""The pcie-acs step: ACS redirect on the bridges above the GPUs, read and decided by hwtune/acs.py.
It reports, never changes: clearing ACS removes the isolation IOMMU groups rely on (see acs.py)."""

from __future__ import annotations

from gpubox.steps import Finding, Step

from .acs import AcsFacts, AcsOptions, AcsRead, decide


class PcieAcsStep(Step):
    """ACS redirect above the GPUs: reported, never changed."""

    name = "pcie-acs"
    title = "PCIe ACS on the bridges above the GPUs"
    where = "host"

    def options(self, ctx) -> AcsOptions:
        return AcsOptions()

    def gather(self, ctx) -> AcsFacts:
        return ctx.fact(AcsRead)

    def decide(self, facts: AcsFacts, opts: AcsOptions) -> Finding:
        return decide(facts)


def steps(ctx=None) -> list:
    """The pcie-acs step (gpubox.areas.PIPELINE)."""
    return [PcieAcsStep()]
