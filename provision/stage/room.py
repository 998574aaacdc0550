"""Room checks: the destination's free space and, for tmpfs in a container, its memory limit
(tmpfs pages are charged to the writer's memory cgroup), each with a margin."""

from __future__ import annotations

import os

from .errors import StageError
from .sizes import size_text

FS_MARGIN = 1 << 30  # keep 1 GiB free on the destination filesystem
MEM_MARGIN = 4 << 30  # and 4 GiB of the container's memory limit for everything else


def fstype(path: str) -> str | None:
    """Filesystem type of the mount holding path, from /proc/self/mounts (read only)."""
    return mount_of(path)[0]


def mount_of(path: str) -> tuple[str | None, tuple[str, ...]]:
    """(filesystem type, mount options) of the mount holding path, from /proc/self/mounts."""
    real = os.path.realpath(path)
    best, found = "", (None, ())
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                mp = parts[1].replace("\\040", " ")
                if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                    best, found = mp, (parts[2], tuple(parts[3].split(",")))
    except OSError:
        return None, ()
    return found


def existing(path: str) -> str:
    """path, or the nearest directory above it that exists (the room of a destination not made yet)."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    return path


def statvfs_free(path: str) -> int:
    st = os.statvfs(existing(path))
    return st.f_bavail * st.f_frsize


def cgroup_memory(cgroup_dir: str) -> tuple[int, int] | None:
    """(memory.max, memory.current) of a cgroup v2 dir, or None when unlimited/unknown."""
    try:
        with open(os.path.join(cgroup_dir, "memory.max")) as f:
            mx = f.read().strip()
        with open(os.path.join(cgroup_dir, "memory.current")) as f:
            cur = int(f.read().strip())
    except (OSError, ValueError):
        return None
    if mx == "max":
        return None
    try:
        return int(mx), cur
    except ValueError:
        return None


def check_room(
    dest: str,
    need: int,
    *,
    tmpfs: bool,
    cgroup_dir: str | None,
    free_space=None,
    margin: int = FS_MARGIN,
    mem_margin: int = MEM_MARGIN,
) -> dict:
    """Figures for `need` more bytes in dest; raises StageError when they do not fit with the margins.

    tmpfs pages are charged to the memory cgroup of the writer (shmem), so inside an LXC container a
    52 GB model in a 64 GB container leaves 12 GB for the server and everything else."""
    free = (free_space or statvfs_free)(dest)
    fig = {"need": need, "free": free, "margin": margin}
    problems = []
    if need + margin > free:
        problems.append(
            f"{dest} needs {size_text(need)} but its filesystem has {size_text(free)} free "
            f"(keeping a {size_text(margin)} margin)"
        )
    mem = cgroup_memory(cgroup_dir) if (tmpfs and cgroup_dir) else None
    if mem:
        limit, used = mem
        fig.update(mem_limit=limit, mem_used=used, mem_margin=mem_margin)
        if need + mem_margin > limit - used:
            problems.append(
                f"tmpfs pages count against the container's memory: limit {size_text(limit)}, "
                f"{size_text(used)} in use, {size_text(limit - used)} left; "
                f"staging {size_text(need)} would leave "
                f"{size_text(limit - used - need)} (< {size_text(mem_margin)} margin)"
            )
    if problems:
        raise StageError(
            "; ".join(problems),
            "free space or raise the container's memory (pct set VMID --memory MiB), "
            "or pass --force to stage anyway",
        )
    return fig
