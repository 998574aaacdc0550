"""Temp files a killed run left on a box, found and removed by the next run (under the box lock).

Every temp gpubox creates on a host or container is named by `gpubox.safeio.tmp_name`
(`.<name>.gpubox.tmp.<pid>.<hex>`); older releases wrote `.<name>.gpubox.<pid|hex>.tmp`, and the
container config is written Proxmox's way, `<vmid>.conf.tmp.<pid>` (pve-container's
PVE::LXC::Config write path through pmxcfs). A run killed between create and rename leaves one
of them in the directory it was writing, and nothing ever removed it.

`sweep(host, dirs)` runs once the box lock is held (gpubox.boxlock), before any step: in the
directories gpubox writes, a temp of ours is stale when its writer cannot still be writing it:
older than STALE_S (a write takes milliseconds; another box's run on the same host may be
writing a shared directory such as /etc/sysctl.d right now, so age is the test, not the lock).
What it removed is returned and shown by the caller.
"""

from __future__ import annotations

import re
import time

from .safeio import is_tmp

STALE_S = 600.0
# Directories gpubox writes on a Proxmox host / in a container (logical paths, under the root prefix).
HOST_DIRS = (
    "/etc/modules-load.d",
    "/etc/modprobe.d",
    "/etc/udev/rules.d",
    "/etc/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/etc/systemd/system",
    "/etc/pve/lxc",
    "/etc/cron.d",
    "/etc/gpubox",
    "/var/lib/prometheus/node-exporter",
    "/run/lock/gpubox",
)
CONTAINER_DIRS = (
    "/etc",
    "/etc/gpubox",
    "/etc/systemd/system",
    "/etc/cron.d",
    "/var/lib/gpubox",
    "/var/lib/gpubox/history",
    "/var/lib/prometheus/node-exporter",
)
_LEGACY = re.compile(r"^\..+\.gpubox\.[0-9a-f]+\.tmp$")
_PVE_CONF = re.compile(r"^[0-9]+\.conf\.tmp\.[0-9]+$")


def ours(name: str, directory: str) -> bool:
    """Whether NAME in DIRECTORY is a temp gpubox writes (current, older or Proxmox-style)."""
    if is_tmp(name) or _LEGACY.match(name):
        return True
    return directory.rstrip("/") == "/etc/pve/lxc" and bool(_PVE_CONF.match(name))


def sweep(host, dirs, now: float | None = None) -> list[str]:
    """Remove stale gpubox temps in DIRS on HOST; the logical paths removed."""
    now = time.time() if now is None else now
    removed = []
    for d in dirs:
        try:
            names = host.listdir(d)
        except Exception:  # a missing or unreadable directory (any transport's error) holds nothing
            continue
        for n in names:
            if not ours(n, d):
                continue
            path = f"{d.rstrip('/')}/{n}"
            try:
                st = host.stat(path)
                if st is None or st.is_dir or now - st.mtime < STALE_S:
                    continue
                host.remove(path)
                removed.append(path)
            except OSError:
                continue
    return removed
