"""Test helper for the lxc tests: a Proxmox host root in a temp dir with real device nodes."""

from __future__ import annotations

from pathlib import Path

from gpubox.host import Host
from gpubox.inventory import HostEntry
from gpubox.simbox.lxc import PROC_DEVICES_CHAR, mknod, proc_devices
from gpubox.transport.local import LocalTransport

FIXTURES = Path(__file__).parent / "fixtures" / "lxc"


def fake_host(root: Path, gpus: int = 2, uvm: int | None = 511, uvm_nodes: bool = True) -> Host:
    """Host 'pve1' rooted at `root`: /proc/devices (nvidia 195, nvidia-caps 235, nvidia-uvm `uvm`)
    and /dev/nvidia{0..gpus-1}, nvidiactl, nvidia-modeset, nvidia-caps/nvidia-cap{1,2}, uvm nodes."""
    char = [c for c in PROC_DEVICES_CHAR if c[1] != "nvidia-uvm"]
    if uvm is not None:
        char.append((uvm, "nvidia-uvm"))
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/devices").write_text(proc_devices(char))
    for i in range(gpus):
        mknod(root / f"dev/nvidia{i}", 195, i)
    mknod(root / "dev/nvidiactl", 195, 255)
    mknod(root / "dev/nvidia-modeset", 195, 254)
    mknod(root / "dev/nvidia-caps/nvidia-cap1", 235, 1, 0o400)
    mknod(root / "dev/nvidia-caps/nvidia-cap2", 235, 2, 0o444)
    if uvm is not None and uvm_nodes:
        mknod(root / "dev/nvidia-uvm", uvm, 0)
        mknod(root / "dev/nvidia-uvm-tools", uvm, 1)
    (root / "etc/pve/lxc").mkdir(parents=True, exist_ok=True)
    return Host(HostEntry("pve1", {"gpubox_root": str(root)}), LocalTransport("pve1"))


STALE_OLD = (FIXTURES / "pve8_cgroup2_stale.conf").read_bytes()
STALE_NEW = (FIXTURES / "pve8_cgroup2_stale.expected.conf").read_text()


def host_with_stale_conf(root: Path) -> Host:
    """A fake host whose CT 200 config is the stale-uvm fixture, mode 0640 as pmxcfs keeps it."""
    import os

    from gpubox.provision.lxcconf import conf_path

    h = fake_host(root)
    real = h.path(conf_path(200))
    with open(real, "wb") as f:
        f.write(STALE_OLD)
    os.chmod(real, 0o640)
    return h
