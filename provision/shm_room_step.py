"""The shm-room step: NCCL's room in /dev/shm once the weights are staged (provision.shmroom),
a pure decide over facts with no repair gpubox may make (issue 28): the finding names the cause
and the operator's command, since the sizes involved are not gpubox's. It runs after staging
(gpubox.areas.PIPELINE), so /dev/shm is judged as the server will find it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.errors import GpuboxError
from gpubox.steps import Finding, Step

from . import shmroom
from .lxc import ConfText
from .toolkit import finding_of


@dataclass
class ShmOptions:
    ranks: int = 1  # the largest TP size the box runs (gpubox_bench.tp, else gpubox_gpus)
    vmid: int | None = None  # for the CT config named in the repair


@dataclass
class ShmEvidence:
    size: int | None = None
    free: int | None = None
    mem_max: int | None = None
    mem_current: int | None = None
    need: int = 0
    host_mount: str | None = None  # the CT config's tmpfs mount entry for dev/shm


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
        vmid = getattr(ctx.box, "vmid", None)
        return ShmOptions(max(sizes or [int(gpus or 1)]), int(vmid) if vmid is not None else None)

    def gather(self, ctx) -> shmroom.ShmFacts:
        facts = ctx.fact(shmroom.ShmFact)
        vmid = getattr(ctx.box, "vmid", None)
        if facts.free is not None and vmid is not None:
            # the host's CT config says whether the host sizes this tmpfs (read where it lives;
            # a container-side run that cannot reach its host judges without it)
            try:
                facts.host_mount = shmroom.host_mount(ctx.fact(ConfText, int(vmid)))
            except (GpuboxError, OSError):
                facts.host_mount = None
        return facts

    def decide(self, facts: shmroom.ShmFacts, opts: ShmOptions) -> Finding:
        status, detail, cause, repair = shmroom.decide(facts, opts.ranks, opts.vmid)
        ev = ShmEvidence(
            facts.size,
            facts.free,
            facts.mem_max,
            facts.mem_current,
            shmroom.need_bytes(opts.ranks),
            facts.host_mount,
        )
        return finding_of(status, detail, cause, repair, ev)


def steps(ctx=None) -> list:
    """The shm-room step (gpubox.areas.PIPELINE)."""
    return [ShmRoomStep()]
