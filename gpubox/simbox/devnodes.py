"""Real character device nodes for the simulated box, shared by the builder (gpubox.simbox.lxc)
and the `pct` stand-in (which binds the host's nodes into the container at start), so neither
imports the other for it."""

from __future__ import annotations

import os
import stat


def mknod(path, major: int, minor: int, mode: int = 0o666) -> None:
    """A real character device node (replacing whatever is there)."""
    from ..errors import GpuboxError

    path = str(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    try:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    except PermissionError:
        raise GpuboxError(
            "cannot create device nodes for the simulated box (mknod: EPERM)",
            "run as root or with CAP_MKNOD (e.g. in CI's container)",
        ) from None
    os.chmod(path, mode)
