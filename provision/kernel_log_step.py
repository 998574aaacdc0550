"""The kernel-log step: Xids and corrected error counts in the host's kernel log, this boot and the
one before (provision.kmsg), a pure decide over facts. It only reports: a GPU that fell off the bus
or has memory errors needs hands or a reset, which the finding names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubox.steps import Finding, Step

from . import kmsg
from .toolkit import finding_of


@dataclass
class KmsgOptions:
    """Nothing to choose: the log is what the host logged."""


@dataclass
class KmsgEvidence:
    source: str = ""
    xids: list[dict[str, object]] = field(default_factory=list)
    corrected: dict[str, int] = field(default_factory=dict)
    uncorrected: dict[str, int] = field(default_factory=dict)
    edac_ce: int = 0


class KernelLogStep(Step):
    """No hardware Xid in the host's kernel log since the boot before this one."""

    name = "kernel-log"
    title = "GPU errors in the host's kernel log (Xid, corrected errors)"
    where = "host"

    def options(self, ctx) -> KmsgOptions:
        return KmsgOptions()

    def gather(self, ctx) -> kmsg.KmsgFacts:
        return ctx.fact(kmsg.KmsgFact)

    def decide(self, facts: kmsg.KmsgFacts, opts: KmsgOptions) -> Finding:
        status, detail, cause, repair = kmsg.decide(facts)
        s = kmsg.summarize(facts.boots or {})
        ev = KmsgEvidence(
            facts.source,
            [
                {"bus": x.bus, "xid": x.xid, "count": x.count, "boot": x.boot, "first": x.first}
                for x in s.xids
            ],
            s.corrected,
            s.uncorrected,
            s.edac_ce,
        )
        return finding_of(status, detail, cause, repair, ev)


def steps(ctx=None) -> list:
    """The kernel-log step (gpubox.areas.PIPELINE)."""
    return [KernelLogStep()]
