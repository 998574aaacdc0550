"""The docker-toolkit step: Docker + the NVIDIA Container Toolkit inside the LXC (provision.toolkit),
a pure decide over facts with no repair gpubox may make (issue 28): the finding names the cause
and the operator's command, since the files involved are not gpubox's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.steps import OMIT, Finding, Omit, Step

from . import toolkit
from .toolkit import finding_of


@dataclass
class ToolkitOptions:
    """Nothing to choose: the file says what the toolkit will do."""


@dataclass
class ToolkitEvidence:
    config: str
    no_cgroups: bool | None = None
    cli: bool = False
    cdi_specs: list[str] | Omit = OMIT  # the CDI spec files read (when there are any)


class DockerToolkitStep(Step):
    """Docker + nvidia-container-toolkit inside the LXC: no-cgroups must be true there, and no CDI
    spec may pin an NVIDIA node to a stale major."""

    name = "docker-toolkit"
    title = "NVIDIA Container Toolkit inside the container"
    where = "container"

    def options(self, ctx) -> ToolkitOptions:
        return ToolkitOptions()

    def gather(self, ctx) -> toolkit.ToolkitFacts:
        return ctx.fact(toolkit.ToolkitFact)

    def decide(self, facts: toolkit.ToolkitFacts, opts: ToolkitOptions) -> Finding:
        status, detail, cause, repair = toolkit.decide(facts)
        nc = toolkit.no_cgroups(facts.config) if facts.config is not None else None
        ev = ToolkitEvidence(toolkit.CONFIG if facts.config is not None else "absent", nc, facts.cli)
        if facts.cdi is not None and facts.cdi.specs:
            ev.cdi_specs = [s.path for s in facts.cdi.specs]
        return finding_of(status, detail, cause, repair, ev)


def steps(ctx=None) -> list:
    """The docker-toolkit step (gpubox.areas.PIPELINE)."""
    return [DockerToolkitStep()]
