"""The driver-packages step: the host's NVIDIA driver and fabric manager packages against the
loaded driver (provision.pkgdrift), a pure decide over facts with no repair gpubox may make: a
reboot and the package holds are the operator's, so the finding names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubox.steps import Finding, Step

from . import pkgdrift
from .toolkit import finding_of


@dataclass
class PkgOptions:
    """Nothing to choose: the packages are what apt installed."""


@dataclass
class PkgEvidence:
    module: str | None = None
    packages: dict[str, str] = field(default_factory=dict)  # name -> version
    held: list[str] = field(default_factory=list)


class DriverPackagesStep(Step):
    """NVIDIA packages from apt at the loaded driver's version (held, so upgrades cannot split them)."""

    name = "driver-packages"
    title = "NVIDIA driver packages on the Proxmox host"
    where = "host"

    def options(self, ctx) -> PkgOptions:
        return PkgOptions()

    def gather(self, ctx) -> pkgdrift.PkgFacts:
        return ctx.fact(pkgdrift.PkgFact)

    def decide(self, facts: pkgdrift.PkgFacts, opts: PkgOptions) -> Finding:
        status, detail, cause, repair = pkgdrift.decide(facts)
        pkgs = facts.packages or []
        ev = PkgEvidence(facts.module, {p.name: p.version for p in pkgs}, [p.name for p in pkgs if p.held])
        return finding_of(status, detail, cause, repair, ev)


def steps(ctx=None) -> list:
    """The driver-packages step (gpubox.areas.PIPELINE)."""
    return [DriverPackagesStep()]
