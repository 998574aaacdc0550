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

from ..opsproviders import register_ops_provider
from .core import SimBox, StandinError  # noqa: F401


def ops_for(entry):
    """pmxcfs's rules for a simulated host's /etc/pve (gpubox.simbox.pmxcfs), loaded when a
    transport is made: a stand-in command's process never makes one, and starts faster."""
    from .pmxcfs import ops_for as pmxcfs_ops

    return pmxcfs_ops(entry)


# A simulated box's host reaches its /etc/pve through pmxcfs's rules in every process that
# knows the simulator (the CLI loads it for an inventory of simulated hosts: gpubox.commands.sim).
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
# Faults that describe two different boxes: asked together, one would silently win.
CONTRADICTIONS = [
    ("numa_balancing", "no_numa_balancing"),  # the sysctl at 1 / the sysctl absent
    ("nccl_missing", "nccl_misspelled"),  # no NCCL file / a hand-written one
    ("shm_empty", "truncated_shard"),  # nothing staged / a staged shard cut short
]
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

    faults = check_faults(faults)
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise GpuboxError(f"{dest} is not empty", "give a new or empty directory")
    sim = SimBox(dest, gpus=gpus, vmid=vmid, box=box, host=host)
    sim.create(sorted(faults))
    for mod in _piece_modules():
        mod.build(sim, faults)
    sim.write_inventory()
    return sim


def check_faults(faults: Iterable[str]) -> set[str]:
    """The fault set asked for ('seed' expanded), every name known and no two contradicting:
    GpuboxError otherwise, before anything is made."""
    from ..errors import GpuboxError

    faults = set(faults)
    if "seed" in faults:
        faults.discard("seed")
        faults.update(f for f in SEED_FAULTS if f in all_faults())
    unknown = sorted(faults - set(all_faults()))
    if unknown:
        from ..suggest import with_hint

        raise GpuboxError(
            with_hint(f"unknown simulated fault(s): {', '.join(unknown)}", unknown[0], all_faults()),
            f"known: {', '.join(sorted(all_faults()))}",
        )
    clash = [pair for pair in CONTRADICTIONS if set(pair) <= faults]
    if clash:
        a, b = clash[0]
        raise GpuboxError(f"faults {a} and {b} contradict each other", f"keep one of {a}, {b}")
    return faults


def remove(dest: str | os.PathLike) -> Path:
    """Delete a simulated box's directory, and only one: DEST must hold the builder's sim.json and
    inventory (a typo'd path to a real directory is refused, not emptied)."""
    import shutil

    from ..errors import GpuboxError

    d = Path(dest)
    if d.is_symlink() or not d.is_dir():
        raise GpuboxError(
            f"{d} is not a directory", "give the directory `gpubox sim create` or `demo --keep` made"
        )
    d = d.resolve()
    if not ((d / "sim.json").is_file() and (d / "inventory.yml").is_file()):
        raise GpuboxError(
            f"{d} is not a simulated box (no sim.json and inventory.yml)",
            "give the directory `gpubox sim create` or `demo --keep` made",
        )
    shutil.rmtree(d)
    return d


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
