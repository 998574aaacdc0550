"""Expected GPUs: the inventory's `gpubox_gpus` against what the host really has.

A GPU that dropped out -- gone from the PCI bus after an Xid 79 ("GPU has fallen off the bus"),
present on the bus but not taken by the driver ("NVIDIA probe routine failed"), or missing from
NVML -- is a hardware failure. The box must not be repaired into a smaller box: no boot
persistence (modules-load/udev, the MaxReadReq unit) is rewritten for fewer GPUs and no
container restart "fixes" it. So this module only names the missing GPUs by bus id and says
what to check; the steps that own persistence refuse while it reports a shortfall.

Sources of truth, read on the host:
- the driver: one directory per GPU it holds under /proc/driver/nvidia/gpus/<bus id>/
  (NVIDIA's open-gpu-kernel-modules, kernel-open/nvidia/nv-procfs.c);
- the PCI bus: NVIDIA functions of class 0300/0302 in /sys/bus/pci/devices (linux
  Documentation/ABI/testing/sysfs-bus-pci);
- gpubox's own record of the box as it was set up: the bus ids in the MaxReadReq boot unit it
  wrote (hwtune.pcie.unit_text), so a GPU gone from the bus is still named by its bus id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubox.errors import GpuboxError
from gpubox.facts import Fact
from gpubox.hwtune.pcie import NVIDIA_VENDOR, UNIT_PATH, PciFunctions, unit_bdfs

DRIVER_DIR = "/proc/driver/nvidia/gpus"

# What the operator checks: the kernel log for the Xid, then the hardware (NVIDIA's Xid catalog:
# 79 = GPU has fallen off the bus; causes named there: power, thermal, PCIe link/slot).
ADVICE = (
    'look for Xid 79 ("NVRM: Xid (PCI:...): 79, GPU has fallen off the bus") in the host\'s kernel log '
    "(journalctl -k | grep -iE 'NVRM: Xid|fallen off'); reseat the GPU and its power cables, check "
    "the PSU and riser, then power-cycle the host; gpubox does not rewrite persistence or restart "
    "the container for fewer GPUs"
)


@dataclass
class GpuPresence:
    """Where the GPUs show up on the host. None = that source could not be read."""

    driver: list[str] | None = None  # bus ids under /proc/driver/nvidia/gpus
    pci: list[str] | None = None  # NVIDIA GPU-class functions in sysfs
    recorded: list[str] = field(default_factory=list)  # bus ids in gpubox's MaxReadReq unit


@dataclass
class Shortfall:
    """The finding: how many GPUs are seen of how many expected, and which are missing."""

    seen: int
    want: int
    missing: dict[str, str]  # bus id -> where it is missing
    unnamed: int = 0  # missing GPUs without a known bus id

    @property
    def detail(self) -> str:
        parts = [f"{b} {why}" for b, why in self.missing.items()]
        if self.unnamed:
            parts.append(f"{self.unnamed} more not identified (no record of their bus ids)")
        return f"{self.seen} of {self.want} GPUs: " + "; ".join(parts)

    cause = "a GPU fell off the bus or failed to initialize (hardware, power or PCIe link)"
    repair = ADVICE


def _norm(bdf: str) -> str:
    b = bdf.strip().lower()
    if b.count(":") == 1:
        b = "0000:" + b
    dom, bus, rest = b.split(":", 2)
    return f"{dom[-4:]:0>4}:{bus}:{rest}"


def shortfall(p: GpuPresence, expect: int | None) -> Shortfall | None:
    """Pure: the GPUs missing against the inventory (and against the bus and the record), or None."""
    drv = {_norm(b) for b in p.driver} if p.driver is not None else None
    pci = {_norm(b) for b in p.pci} if p.pci is not None else None
    rec = {_norm(b) for b in p.recorded}
    missing: dict[str, str] = {}
    if pci is not None and drv is not None:
        for b in sorted(pci - drv):
            missing[b] = "is on the PCI bus but the NVIDIA driver does not hold it (probe failed)"
    if pci is not None:
        for b in sorted(rec - pci):
            missing[b] = "is gone from the PCI bus"
    elif drv is not None:
        for b in sorted(rec - drv):
            missing[b] = "is not held by the NVIDIA driver"
    seen_set = drv if drv is not None else pci
    if seen_set is None:
        return None
    seen = len(seen_set)
    want = max(int(expect or 0), len(seen_set | set(missing)))
    if seen >= want and not missing:
        return None
    unnamed = max(0, want - seen - len([b for b in missing if b not in seen_set]))
    return Shortfall(seen, want, missing, unnamed)


def gpu_functions(funcs) -> list[str]:
    """Bus ids of the NVIDIA GPU-class functions among hwtune.pcie.PciFunctions' answer."""
    return [f.bdf for f in funcs if f.vendor == NVIDIA_VENDOR and f.kind == "gpu"]


class GpuPresenceFact(Fact):
    """The driver's GPUs and gpubox's recorded bus ids (the PCI bus comes from PciFunctions,
    read once per run and shared with the PCIe steps)."""

    @staticmethod
    def read(host) -> GpuPresence:
        driver = sorted(host.listdir(DRIVER_DIR)) if host.exists(DRIVER_DIR) else None
        return GpuPresence(driver, None, unit_bdfs(host.read_text(UNIT_PATH, default="")))


def read_presence(ctx) -> GpuPresence:
    """GpuPresence through the context's fact cache."""
    p = ctx.fact(GpuPresenceFact)
    try:
        pci = gpu_functions(ctx.fact(PciFunctions))
    except GpuboxError:  # no sysfs under this root: the bus is simply not a source here
        pci = None
    return GpuPresence(p.driver, pci, p.recorded)
