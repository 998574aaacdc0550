"""Temp files a killed run left on a box, found and removed by the next run (under the box lock).

Every temp gpubox creates on a host or container is named by `gpubox.safeio.tmp_name`
(`.<name>.gpubox.tmp.<pid>.<hex>`); older releases wrote `.<name>.gpubox.<pid|hex>.tmp`. A run killed between create and rename
leaves one of them in the directory it was writing, and nothing ever removed it. The container
config is written Proxmox's way, `<vmid>.conf.tmp.<pid>`, a name a Proxmox task's temp also has:
those are never swept by name here; provision/confjournal.py removes exactly the ones gpubox
recorded before creating them.

`sweep(host, dirs)` runs once the box lock is held (gpubox.boxlock), before any step: in the
directories gpubox writes, a temp of ours is stale when its writer cannot still be writing it:
older than STALE_S (a write takes milliseconds; another box's run on the same host may be
writing a shared directory such as /etc/sysctl.d right now, so age is the test, not the lock), or,
on a local host, written by this machine from a pid that no longer runs (a SIGKILLed run's,
removed at once: its name carries the writer's node tag and pid, gpubox.safeio.tmp_name).
What it removed is returned and shown by the caller.
"""

from __future__ import annotations

import os
import re
import stat
import time

from . import safepath
from .errors import GpuboxError
from .safeio import is_tmp, pid_alive, written_here

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


def ours(name: str, directory: str) -> bool:
    """Whether NAME is a temp only gpubox writes (current or an older release's naming)."""
    return bool(is_tmp(name) or _LEGACY.match(name))


def _stale(name: str, mtime: float, now: float, local: bool) -> bool:
    """Older than STALE_S; or, on a local host, written by this machine (its node tag,
    safeio.NODE_TAG) from a pid that is gone: a pid means something only in the process table of
    the machine that wrote it (another control node may write here over SSH right now)."""
    if now - mtime >= STALE_S:
        return True
    if not local:
        return False
    pid = written_here(name)
    return pid is not None and pid != os.getpid() and not pid_alive(pid)


def sweep(host, dirs, now: float | None = None) -> list[str]:
    """Remove stale gpubox temps in DIRS on HOST; the logical paths removed. On a local host each
    directory is opened beneath the root prefix with no link followed and each temp is removed
    with unlinkat relative to it, only when it is a regular file of ours (gpubox.safepath)."""
    now = time.time() if now is None else now
    if host.transport.is_local:
        return [p for d in dirs for p in _sweep_local(host, d, now)]
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
                if st is None or not st.is_file or not _stale(n, st.mtime, now, False):
                    continue
                host.remove(path)
                removed.append(path)
            except (OSError, GpuboxError):
                continue
    return removed


def _open_local(host, d: str) -> int | None:
    """An fd of logical directory D on a local host, no link followed beneath the root prefix
    (except the system's own, gpubox.safepath.SYSTEM_LINKS); None when absent or refused."""
    try:
        anchor, rel = safepath.system_anchor(host.path(d), host.path("/")) or (host.path("/"), d.lstrip("/"))
        with safepath.Anchor(anchor) as a:
            return a.opendir(rel)
    except (OSError, GpuboxError):
        return None


def _sweep_local(host, d: str, now: float) -> list[str]:
    dfd = _open_local(host, d)
    if dfd is None:
        return []
    removed = []
    try:
        for n in sorted(os.listdir(dfd)):
            if not ours(n, d):
                continue
            st = safepath.entry(dfd, n)
            if st is None or not stat.S_ISREG(st.st_mode) or not _stale(n, st.st_mtime, now, True):
                continue
            path = f"{d.rstrip('/')}/{n}"
            try:
                if safepath.remove_entry(dfd, n, host.path(path)):
                    removed.append(path)
            except (OSError, GpuboxError):
                continue
    except OSError:
        pass
    finally:
        os.close(dfd)
    return removed
