"""The skeleton both roots share: directories, kernel knobs, driver version, systemctl."""

from __future__ import annotations

from .core import SimBox

FAULTS = {
    "numa_balancing": "kernel.numa_balancing=1 on the host (back on after the reboot)",
    "no_numa_balancing": "the host kernel has no CONFIG_NUMA_BALANCING (the sysctl file is absent)",
    "lockdown": "the host kernel is locked down (integrity): PCI config writes are refused",
}

HOST_PROGRAMS = ("/usr/bin/setpci", "/usr/bin/nvidia-modprobe", "/usr/bin/env", "/bin/sh", "/usr/bin/timeout")
CONTAINER_PROGRAMS = ("/usr/bin/env", "/bin/sh", "/usr/bin/timeout")
DRIVER = "580.95.05"
DPKG_STATUS = "".join(
    f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n\n"
    for name, version in (
        ("pciutils", "1:3.13.0-2"),
        ("proxmox-ve", "9.0.0"),
        ("pve-manager", "9.0.11"),
    )
)
PROC_VERSION = (
    f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  Release Build  "
    "(dvs-builder@U22-I3-AE18-23-3)  Wed Oct  1 18:11:47 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
)


def build(sim: SimBox, faults: set[str]) -> None:
    h, c = sim.hpath, sim.cpath
    for d in (
        "/etc/sysctl.d",
        "/etc/modules-load.d",
        "/etc/udev/rules.d",
        "/etc/systemd/system",
        "/run/lock/lxc",
        "/proc/sys/kernel",
        "/proc/driver/nvidia",
        "/sys/kernel/security",
        "/var/lib/vz",
        "/tmp",
        "/run/systemd/system",
    ):
        h(d).mkdir(parents=True, exist_ok=True)
    for d in (
        "/dev/shm",
        "/etc/systemd/system",
        "/etc/gpubox",
        "/proc/driver/nvidia",
        "/tmp",
        "/var/lib/gpubox",
        "/proc/sys/kernel",
        "/run/systemd/system",
    ):
        c(d).mkdir(parents=True, exist_ok=True)
    h("/etc/hostname").write_text(f"{sim.host}\n")
    c("/etc/hostname").write_text(f"{sim.box}\n")
    # dpkg's database: a Proxmox host with the NVIDIA driver from its .run installer (no driver
    # package from apt; gpubox's driver-packages step reads it)
    h("/var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    h("/var/lib/dpkg/status").write_text(DPKG_STATUS)
    h("/etc/os-release").write_text(
        'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\n'
    )
    if "no_numa_balancing" not in faults:
        h("/proc/sys/kernel/numa_balancing").write_text("1\n" if "numa_balancing" in faults else "0\n")
    h("/sys/kernel/security/lockdown").write_text(
        "none [integrity] confidentiality\n" if "lockdown" in faults else "[none] integrity confidentiality\n"
    )
    # The container shares the host kernel: same driver version in both /proc views.
    h("/proc/driver/nvidia/version").write_text(PROC_VERSION)
    c("/proc/driver/nvidia/version").write_text(PROC_VERSION)
    # Both run systemd (Proxmox hosts always; the container as a Debian/Ubuntu CT does); tools
    # tell systemd from cron-only systems by /run/systemd/system, as sd_booted(3) does.
    sim.install_standin("systemctl")
    sim.install_standin("journalctl")  # the host's kernel log (never this machine's)
    # The programs the boot artifacts name, at their Debian paths (gpubox.bootbins checks they are
    # there, as on a real host): each runs the one on PATH, a stand-in or this machine's own tool.
    for root, progs in ((h, HOST_PROGRAMS), (c, CONTAINER_PROGRAMS)):
        for prog in progs:
            p = root(prog)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f'#!/bin/sh\nexec {prog.rsplit("/", 1)[-1]} "$@"\n')
            p.chmod(0o755)
