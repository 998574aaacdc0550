"""The docker-toolkit step: Docker + the NVIDIA Container Toolkit inside the LXC (provision.toolkit),
a pure decide over facts with no repair gpubox may make (issue 28): the finding names the cause
and the operator's command, since the files involved are not gpubox's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.steps import Finding, Step

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


class DockerToolkitStep(Step):
    """Docker + nvidia-container-toolkit inside the LXC: no-cgroups must be true there."""

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
        return finding_of(status, detail, cause, repair, ev)


def steps(ctx=None) -> list:
    """The docker-toolkit step (gpubox.areas.PIPELINE)."""
    return [DockerToolkitStep()]
