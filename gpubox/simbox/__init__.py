"""A simulated box: the files of a Proxmox host and its LXC container as they really look, in a
directory, plus stand-ins for the commands that cannot exist here (`pct`, `nvidia-modprobe`,
`lxc-cgroup`, `systemctl`).

Layout under DEST:

    pve1/        the Proxmox host's root (gpubox_root of pve1): /etc/pve/lxc/200.conf, /proc/devices,
                 /dev/nvidia*, /sys/bus/pci/devices/..., /proc/sys/kernel/numa_balancing, ...
    ct200/       the container's root (gpubox_root of ct200): /dev/shm, /mnt/models/..., /etc/...
    bin/         stand-ins, first on PATH only for the simulated hosts (gpubox_bin_dirs)
    sim.json     the simulated kernel/Proxmox state (container status, live cgroup rules, ...)
    calls.jsonl  every stand-in call, one JSON object a line
    inventory.yml  an Ansible inventory for this box (local connection + gpubox_root)

The builder is split into pieces by area (gpubox.simbox.<piece>), each owning its files, its
faults and its stand-ins; a piece is a module with `FAULTS: dict[str, str]` and
`build(sim: SimBox, faults: set[str]) -> None`.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Iterable

from ..host import register_ops_provider
from .core import SimBox, StandinError  # noqa: F401
from .pmxcfs import ops_for

# A simulated box's host reaches its /etc/pve through pmxcfs's rules in every process that
# knows the simulator (the CLI loads it for an inventory of simulated hosts: gpubox.cli_sim).
register_ops_provider(ops_for)

PIECES = ["base", "lxc", "cuda", "pci", "nccl", "model", "server", "persist", "gpulost"]


def _piece_modules():
    for name in PIECES:
        yield importlib.import_module(f"{__name__}.{name}")


def all_faults() -> dict[str, str]:
    """Every fault switch the pieces know, name -> what it reproduces."""
    out: dict[str, str] = {}
    for mod in _piece_modules():
        out.update(getattr(mod, "FAULTS", {}))
    return out


# The seed's story (docs/facts.md "The seed's story"): what a reboot did to the box.
SEED_FAULTS = ["uvm_stale_major", "uvm_missing", "mrrs_512", "numa_balancing", "nccl_missing", "shm_empty"]
# What `gpubox demo` breaks: the seed's reboot plus a stopped container.
DEMO_FAULTS = SEED_FAULTS + ["container_stopped"]


def build(
    dest: str | os.PathLike,
    faults: Iterable[str] = (),
    *,
    gpus: int = 8,
    vmid: int = 200,
    box: str = "ct200",
    host: str = "pve1",
) -> SimBox:
    """Create a simulated box in DEST (which must be empty or absent) with the given faults."""
    from ..errors import GpuboxError

    faults = set(faults)
    if "seed" in faults:
        faults.discard("seed")
        faults.update(f for f in SEED_FAULTS if f in all_faults())
    unknown = sorted(faults - set(all_faults()))
    if unknown:
        raise GpuboxError(
            f"unknown simulated fault(s): {', '.join(unknown)}", f"known: {', '.join(sorted(all_faults()))}"
        )
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise GpuboxError(f"{dest} is not empty", "give a new or empty directory")
    sim = SimBox(dest, gpus=gpus, vmid=vmid, box=box, host=host)
    sim.create(sorted(faults))
    for mod in _piece_modules():
        mod.build(sim, faults)
    sim.write_inventory()
    return sim


def standin_main() -> None:
    """Entry of every stand-in script: bin/<name> -> gpubox.simbox.cmds.<name>.main(sim, argv)."""
    prog = os.path.basename(sys.argv[0])
    sim = SimBox.load(Path(sys.argv[0]).resolve().parent.parent)
    mod = importlib.import_module(f"{__name__}.cmds.{prog.replace('-', '_')}")
    sim.record_call(prog, sys.argv[1:])
    try:
        rc = mod.main(sim, sys.argv[1:])
    except StandinError as exc:
        sys.stderr.write(f"{exc}\n")
        rc = exc.rc
    sys.exit(rc or 0)
