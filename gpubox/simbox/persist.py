"""Boot persistence of a box that gpubox already set up once: the modules-load/udev files for
nvidia-uvm, the PCIe MaxReadReq oneshot unit (enabled) and the NUMA sysctl.d file.

A healthy simulated box has them, so `doctor`/`recover` (which check persistence by default) find
nothing to do there. The reboot faults mean the matching repair was never persisted — that is
why the reboot undid it — so each of those faults leaves its persistence out.
"""

from __future__ import annotations

from ..hwtune import numa, pcie
from ..provision import lxc
from .core import SimBox

FAULTS: dict[str, str] = {}


def build(sim: SimBox, faults: set[str]) -> None:
    from ..host import Host
    from ..inventory import HostEntry
    from ..transport.local import LocalTransport

    if not faults & {"uvm_missing"}:
        for path, text in lxc.persist_files(sim.gpus).items():
            p = sim.hpath(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    if not faults & {"numa_balancing", "no_numa_balancing"}:
        sim.hpath(numa.CONF).write_text(numa.conf_text(0))
    if not faults & {"mrrs_512", "lockdown"}:
        host = Host(HostEntry(sim.host, {"gpubox_root": str(sim.host_root)}), LocalTransport(sim.host))
        funcs = [(d.bdf, d.ident) for d in pcie.read_devices(host) if d.devctl is not None]
        sim.hpath(pcie.UNIT_PATH).write_text(pcie.unit_text(funcs, pcie.parse_mrrs(4096)))
        with sim.state() as st:
            st.setdefault("units", {}).setdefault("host", {})[pcie.UNIT] = {
                "enabled": True,
                "active": True,
                "starts": 1,
            }
