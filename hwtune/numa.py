"""kernel.numa_balancing on the Proxmox host.

Facts (docs/facts.md "NUMA balancing", kernel admin-guide sysctl/kernel.rst): 0 off, 1 on, 2 memory
tiering; the file is absent when the kernel lacks CONFIG_NUMA_BALANCING (then there is nothing
to do). Automatic page migration moves a serving process's pages between nodes under it; the
seed box measured the tuning (with MRRS and NCCL) at +7.5%/+18.5%.

The live value is written with `tee <root>/proc/sys/kernel/numa_balancing`: a plain
open-truncate-write like `sysctl -w` does (sysctl itself has no root prefix, and /proc/sys
files cannot be replaced by rename, so Host.write's atomic rename does not apply there).
"""

from __future__ import annotations

import re

from gpubox.errors import GpuboxError
from gpubox.facts import Fact

KNOB = "/proc/sys/kernel/numa_balancing"
CONF = "/etc/sysctl.d/90-gpubox-numa.conf"
SYSCTL_DIRS = (
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
)
SYSCTL_CONF = "/etc/sysctl.conf"
MEANING = {0: "off", 1: "on", 2: "memory tiering"}
_LINE = re.compile(r"\s*-?kernel[./]numa_balancing\s*=\s*(\S+)")


def desired(ctx) -> int:
    v = ctx.box.var("gpubox_numa_balancing", 0)
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = -1
    if n not in MEANING:
        raise GpuboxError(
            f"gpubox_numa_balancing = {v!r} is not 0, 1 or 2", "set it to 0 (off) in the inventory"
        )
    return n


# --- facts ------------------------------------------------------------------------------------


class LiveValue(Fact):
    """The live kernel.numa_balancing; None when the kernel has no NUMA balancing."""

    @staticmethod
    def read(host) -> str:
        return host.read_text(KNOB, default="")

    @staticmethod
    def parse(raw: str) -> int | None:
        text = raw.strip()
        return int(text) if text else None


class SysctlFiles(Fact):
    """Every sysctl.d file systemd-sysctl would apply (a name in an earlier directory hides the
    same name in a later one), as [(path, text)] in application order, then /etc/sysctl.conf."""

    @staticmethod
    def read(host) -> list[tuple[str, str]]:
        files: dict[str, str] = {}
        for d in SYSCTL_DIRS:
            try:
                names = host.listdir(d)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for n in names:
                if n.endswith(".conf") and n not in files:
                    files[n] = f"{d}/{n}"
        out = [(files[n], host.read_text(files[n], default="")) for n in sorted(files)]
        return out + [(SYSCTL_CONF, host.read_text(SYSCTL_CONF, default=""))]

    @staticmethod
    def parse(raw: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(p, t) for p, t in raw]


def boot_value(files: list[tuple[str, str]]) -> tuple[int | None, str | None]:
    """The value sysctl.d applies at boot and the file it comes from: files apply in name order,
    the last one wins; /etc/sysctl.conf is applied last (99-sysctl.conf link on Debian)."""
    value, source = None, None
    for path, text in files:
        for line in text.splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            if path == SYSCTL_CONF and not m.group(1).isdigit():
                continue
            try:
                value, source = int(m.group(1)), path
            except ValueError:
                pass
    return value, source


def conf_text(value: int) -> str:
    return (
        "# Managed by gpubox (hwtune numa): automatic NUMA page migration off for GPU serving.\n"
        f"kernel.numa_balancing = {value}\n"
    )
