"""Container-side diagnoses that have no repair gpubox may make (issue 28): the NVIDIA
Container Toolkit inside the LXC (provision.toolkit) and NCCL's room in /dev/shm once the
weights are staged (provision.shmroom). Each is a pure decide over facts; the finding names the
cause and the operator's command, since the files and sizes involved are not gpubox's.

Position 35: after staging (30), so /dev/shm is judged as the server will find it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.steps import FAILED, OK, SKIPPED, Finding, Step

from . import shmroom, toolkit


def _finding(status: str, detail: str, cause, repair, ev) -> Finding:
    if status == OK:
        return Finding.ok(detail, evidence=ev)
    if status == FAILED:
        return Finding.failed(detail, cause=cause, repair=repair, evidence=ev)
    return Finding(SKIPPED, detail, ev)


@dataclass
class ToolkitOptions:
    """Nothing to choose: the file says what the toolkit will do."""


@dataclass
class ToolkitEvidence:
    config: str
    no_cgroups: bool | None = None
    cli: bool = False


class ContainerToolkitStep(Step):
    """Docker + nvidia-container-toolkit inside the LXC: no-cgroups must be true there."""

    name = "docker-toolkit"
    title = "NVIDIA Container Toolkit inside the container"
    where = "container"

    def options(self, ctx) -> ToolkitOptions:
        return ToolkitOptions()

    def gather(self, ctx) -> toolkit.ToolkitFacts:
        return ctx.fact(toolkit.ToolkitFact)

    def decide(self, facts: toolkit.ToolkitFacts, opts: ToolkitOptions) -> Finding:
        status, detail, cause, repair = toolkit.judge(facts)
        nc = toolkit.no_cgroups(facts.config) if facts.config is not None else None
        ev = ToolkitEvidence(toolkit.CONFIG if facts.config is not None else "absent", nc, facts.cli)
        return _finding(status, detail, cause, repair, ev)


@dataclass
class ShmOptions:
    ranks: int = 1  # the largest TP size the box runs (gpubox_bench.tp, else gpubox_gpus)


@dataclass
class ShmEvidence:
    size: int | None = None
    free: int | None = None
    mem_max: int | None = None
    mem_current: int | None = None
    need: int = 0


class ShmRoomStep(Step):
    """After staging, /dev/shm and the memory limit still leave NCCL room for its segments."""

    name = "shm-room"
    title = "Room for NCCL in the container's /dev/shm"
    where = "container"

    def options(self, ctx) -> ShmOptions:
        bench = ctx.box.var("gpubox_bench", None) or {}
        tps = bench.get("tp") if isinstance(bench, dict) else None
        sizes = [int(t) for t in tps if str(t).isdigit()] if isinstance(tps, list) else []
        gpus = ctx.box.var("gpubox_gpus", None)
        return ShmOptions(max(sizes or [int(gpus or 1)]))

    def gather(self, ctx) -> shmroom.ShmFacts:
        return ctx.fact(shmroom.ShmFact)

    def decide(self, facts: shmroom.ShmFacts, opts: ShmOptions) -> Finding:
        status, detail, cause, repair = shmroom.judge(facts, opts.ranks)
        ev = ShmEvidence(
            facts.size, facts.free, facts.mem_max, facts.mem_current, shmroom.need_bytes(opts.ranks)
        )
        return _finding(status, detail, cause, repair, ev)


def steps(ctx=None) -> list:
    return [ContainerToolkitStep(), ShmRoomStep()]
