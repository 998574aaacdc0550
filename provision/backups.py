"""The backups gpubox keeps of every file it changes, per box: list, show, diff, put back.

Every write gpubox makes to a host keeps the old content first, on the control node
(gpubox.state.backup_path: `<state>/backups/<host>/<path with / as __>.<stamp>`). This module
finds a box's backups (its Proxmox host's and its container's), compares one with the file as it
is now, and restores it. A restore is a write like any other: the container config goes through
the pmxcfs-safe writer (lxcconf.write_conf: Proxmox's lock, the digest of what was compared, a
backup of what is replaced), every other file through Host.write (atomic, with its own backup),
so a restore can itself be undone the same way.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from gpubox.errors import GpuboxError
from gpubox.state import safe_name, state_dir

from .lxcconf import conf_path, digest, write_conf

_NAME = re.compile(r"^(?P<flat>.+)\.(?P<stamp>\d{8}T\d{6}-\d{6})$")
SHOW_LIMIT = 1 << 20  # a backup is at most what gpubox read (pmxcfs files are under 1 MiB)


@dataclass(frozen=True)
class Backup:
    number: int  # 1 = the newest of the box's backups
    host: str  # the inventory name of the host the file is on (Proxmox host or container)
    path: str | None  # the file's path on that host; None when the name cannot be read back
    file: Path  # the backup on the control node
    stamp: str  # YYYYmmddTHHMMSS-micro, when gpubox took it

    def when(self) -> str:
        s = self.stamp
        return f"{s[0:4]}-{s[4:6]}-{s[6:8]} {s[9:11]}:{s[11:13]}:{s[13:15]}"

    def to_dict(self) -> dict:
        return {
            "number": self.number,
            "host": self.host,
            "path": self.path,
            "backup": str(self.file),
            "taken": self.when(),
            "bytes": self.file.stat().st_size,
        }


_HASHED = re.compile(r"-[0-9a-f]{16}$")


def original_path(flat: str) -> str | None:
    """The path a backup name was made from, where the name can be read back: backup_path writes
    `/` as `__` and replaces a long name, or one with other characters, by a slug plus `-` and 16
    hex digits of its hash (then None: such a name looks like a plain one, so it is never guessed)."""
    if _HASHED.search(flat):
        return None
    path = "/" + flat.replace("__", "/")
    return path if safe_name(path.strip("/").replace("/", "__"), limit=160) == flat else None


def find(box) -> list[Backup]:
    """The box's backups, newest first, numbered from 1."""
    found = []
    for host in dict.fromkeys((box.host.name, box.name)):
        d = state_dir() / "backups" / safe_name(host)
        if not d.is_dir():
            continue
        for f in d.iterdir():
            m = _NAME.match(f.name)
            if m and f.is_file() and not f.is_symlink():
                found.append((m["stamp"], host, original_path(m["flat"]), f))
    found.sort(key=lambda t: (t[0], t[3].name), reverse=True)
    return [Backup(i, host, path, f, stamp) for i, (stamp, host, path, f) in enumerate(found, 1)]


def pick(box, number: int) -> Backup:
    backups = find(box)
    for b in backups:
        if b.number == number:
            return b
    raise GpuboxError(
        f"{box.name} has no backup number {number} ({len(backups)} kept)",
        f"`gpubox backups {box.name}` lists them",
    )


def content(b: Backup) -> bytes:
    with open(b.file, "rb") as f:
        return f.read(SHOW_LIMIT + 1)[:SHOW_LIMIT]


def _host(ctx, b: Backup):
    return ctx.host if b.host == ctx.box.host.name else ctx.container


def current(ctx, b: Backup) -> bytes | None:
    """The file as it is now on its host (None when it does not exist)."""
    if b.path is None:
        raise GpuboxError(
            f"backup {b.number} ({b.file.name}) does not say which file it was", "restore it by hand"
        )
    try:
        return _host(ctx, b).read_bounded(b.path, SHOW_LIMIT)
    except FileNotFoundError:
        return None


def diff(ctx, b: Backup) -> str:
    """What a restore would change: from the file as it is now to the backup."""
    now = current(ctx, b)
    old = content(b)
    label = f"{b.host}:{b.path}"
    return "".join(
        difflib.unified_diff(
            (now or b"").decode(errors="replace").splitlines(keepends=True),
            old.decode(errors="replace").splitlines(keepends=True),
            f"{label} (now)",
            f"{label} (backup {b.number}, {b.when()})",
        )
    )


def restore(ctx, b: Backup) -> str | None:
    """Put the backup back; the path of the backup taken of what it replaced (None: nothing was
    there). The container config goes through Proxmox's lock and the digest just read."""
    now = current(ctx, b)
    data = content(b)
    if now == data:
        return None
    if b.host == ctx.box.host.name and b.path == conf_path(ctx.box.vmid) and now is not None:
        return write_conf(ctx.host, ctx.box.vmid, data.decode(), digest(now))
    return _host(ctx, b).write(b.path, data)
