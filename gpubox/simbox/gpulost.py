"""A GPU that fell off the bus after the reboot (Xid 79): the last GPU's PCI functions are gone
from sysfs, the driver holds one GPU fewer (/proc/driver/nvidia/gpus) and its /dev/nvidiaN node
was never created, on the host or in the container. The inventory still says `gpubox_gpus: N`
and the persistence written when the box was set up (the MaxReadReq unit, the udev rule) still
names all N -- as on a real box, where the setup happened before the GPU was lost.

This piece runs after `persist`, so what it removes is what the reboot lost, not what gpubox
once wrote. Seen for real: NVIDIA/open-gpu-kernel-modules#507 and #1151 (Xid 79),
NVIDIA/NVSentinel#684 (lspci lists the GPU, nvidia-smi does not).
"""

from __future__ import annotations

import shutil

from .core import SimBox

FAULTS = {
    "gpu_lost": "the last GPU fell off the bus after the reboot (Xid 79): PCI function gone, "
    "the driver sees one GPU fewer than gpubox_gpus",
}


def build(sim: SimBox, faults: set[str]) -> None:
    if "gpu_lost" not in faults:
        return
    from .lxc import GPU_BDFS
    from .pci import gpu_bdfs

    last = sim.gpus - 1
    bdf = gpu_bdfs(sim.gpus)[last]
    for fn in (bdf, bdf[:-1] + "1"):
        shutil.rmtree(sim.hpath(f"/sys/bus/pci/devices/{fn}"), ignore_errors=True)
    shutil.rmtree(sim.hpath(f"/proc/driver/nvidia/gpus/{GPU_BDFS[last % len(GPU_BDFS)]}"), ignore_errors=True)
    for p in (sim.hpath(f"/dev/nvidia{last}"), sim.cpath(f"/dev/nvidia{last}")):
        if p.exists() or p.is_symlink():
            p.unlink()
    # what the driver logged when it found the GPU gone at probe time (NVIDIA/NVSentinel#155)
    from .cmds.journalctl import LOG

    log = sim.hpath(LOG.format(boot=0))
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(
            f"2026-12-03T06:01:12+0000 {sim.host} kernel: NVRM: The NVIDIA GPU {bdf}\n"
            f"2026-12-03T06:01:12+0000 {sim.host} kernel: NVRM: (PCI ID: 10de:2bb5) installed in this system has\n"
            f"2026-12-03T06:01:12+0000 {sim.host} kernel: NVRM: fallen off the bus and is not responding to commands.\n"
        )
