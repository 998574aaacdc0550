"""Host tuning: PCIe MaxReadReq and link status, NUMA balancing, NCCL env profiles, GPU topology.

`steps(ctx)` is the entry point the recover/doctor pipeline and the Ansible modules use; the
step names are "pcie-mrrs", "pcie-link", "numa-balancing" and "nccl-env". Options read from
ctx.options: dry_run, persist, mrrs (overrides gpubox_pcie_mrrs), include (extra PCI functions
for pcie-mrrs: "audio", "bridge" or BDFs), profile (overrides gpubox_nccl_profile).
"""

from __future__ import annotations

STEP_NAMES = ("pcie-mrrs", "pcie-link", "numa-balancing", "nccl-env")


def steps(ctx, names=STEP_NAMES) -> list:
    """The host-tuning steps, in order, optionally only those named."""
    from .nccl_env_step import NcclEnvStep
    from .numa_balancing_step import NumaBalancingStep
    from .pcie_link_step import PcieLinkStep
    from .pcie_mrrs_step import PcieMrrsStep

    all_steps = [PcieMrrsStep(), PcieLinkStep(), NumaBalancingStep(), NcclEnvStep()]
    return [s for s in all_steps if s.name in names]
