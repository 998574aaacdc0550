"""Which GPUs the benchmark's servers get: the box's GPU topology as a fact of the run.

The topology is read once per run through the context's fact cache (`ctx.fact(GpuTopology)`),
not kept on the context by hand: bench.launcher picks the GPUs per TP size from it, the result
records it (bench.measure.box_facts), and a remote run sends it to the container side, which takes
it as known (`ctx.know`) because the Proxmox host is out of reach from there (bench.remote).
"""

from __future__ import annotations

from gpubox.facts import Fact
from gpubox.hwtune import topology


class GpuTopology(Fact):
    """hwtune.topology.discover: NVML in the container, else on the host, with the NUMA nodes
    from the host's sysfs; else the host's sysfs; else the inventory."""

    where = "box"

    @staticmethod
    def read(ctx) -> topology.Topology:
        return topology.discover(ctx)


def box_topology(ctx) -> topology.Topology:
    """The box's GPU topology, read once per run."""
    return ctx.fact(GpuTopology)
