"""The cuda step: CUDA works in the container, the CUDA probe's answer judged by
provision.cuda_probe (tests/steps/cuda/*.json). It reports; the repairs are the steps before it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox.steps import OMIT, Finding, Omit, Step

from . import cuda_probe
from .lxc import (
    ContainerStatus,
    CudaProbe,
    gpus_wanted,
)
from .lxc import _control as control


@dataclass
class CudaFacts:
    status: str  # the container's status
    probe: dict[str, Any] | None = None  # the in-container probe (only when running)


@dataclass
class CudaOptions:
    vmid: int = 0
    box: str = "BOX"
    expect_gpus: int | None = None  # gpubox_gpus from the inventory


@dataclass
class CudaEvidence:
    # the in-container probe's answer (provision/cuda_probe), None where it reported nothing
    nodes: dict[str, str] | None | Omit = OMIT  # path -> ok | errno name
    cuinit: int | None | Omit = OMIT  # cuInit's CUresult
    cuinit_name: str | None | Omit = OMIT
    nvml: dict[str, Any] | None | Omit = OMIT  # NVML's answer (count, driver, error)
    kernel_driver: str | None | Omit = OMIT
    user_driver: str | None | Omit = OMIT
    simulated: bool | None | Omit = OMIT
    error: str | None | Omit = OMIT
    causes: list[dict[str, str]] | Omit = OMIT  # {code, cause, repair} per diagnosed cause


_PROBE_KEYS = ("nodes", "cuinit", "cuinit_name", "nvml", "kernel_driver", "user_driver", "simulated", "error")


class CudaStep(Step):
    """CUDA works in the container: the probe's output (a fact) through cuda_probe.decide."""

    name = "cuda"
    title = "CUDA inside the container"
    where = "container"
    requires = ("container",)

    def options(self, ctx) -> CudaOptions:
        want = gpus_wanted(ctx)
        return CudaOptions(ctx.box.vmid, ctx.box.name, None if want is None else int(want))

    def gather(self, ctx) -> CudaFacts:
        st = ctx.fact(ContainerStatus, control(ctx))
        if st["status"] != "running":
            return CudaFacts(st["status"])
        return CudaFacts(st["status"], ctx.fact(CudaProbe))

    def decide(self, facts: CudaFacts, opts: CudaOptions) -> Finding:
        if facts.status != "running":
            return Finding.failed(
                f"cannot probe CUDA: CT {opts.vmid} is {facts.status}",
                cause="the container is not running",
                repair=f"gpubox lxc fix {opts.box} (starts it)",
                evidence=CudaEvidence(),
            )
        res = facts.probe or {}
        ev = CudaEvidence(**{k: res.get(k) for k in _PROBE_KEYS})
        found = cuda_probe.decide(res, opts.box)
        if found:
            ev.causes = [{"code": c, "cause": why, "repair": fix} for c, why, fix in found]
            return Finding.failed(
                "; ".join(why for _, why, _ in found), cause=found[0][1], repair=found[0][2], evidence=ev
            )
        nv = (res.get("nvml") or {}).get("count")
        if opts.expect_gpus and isinstance(nv, int) and nv < opts.expect_gpus:
            return Finding.failed(
                f"NVML sees {nv} of {opts.expect_gpus} GPUs in the container",
                cause="a GPU is missing: lost on the host (see host-devices) or not passed to the container",
                repair="run gpubox doctor on the host side first; it names the missing bus id",
                evidence=ev,
            )
        return Finding.ok(
            f"cuInit(0) = 0; NVML sees {nv} GPUs; driver {res.get('kernel_driver')} "
            f"(host) = {res.get('user_driver')} (container)",
            evidence=ev,
        )


def steps(ctx=None) -> list:
    """The cuda step (gpubox.areas.PIPELINE)."""
    return [CudaStep()]
