"""A host as gpubox sees it: a transport plus the host's root prefix, env and PATH additions.

Code everywhere uses the host's *logical* absolute paths ("/etc/pve/lxc/200.conf",
"/proc/devices"); `Host.path()` puts them under `gpubox_root`, which is how tests and the demo run
the real code against a simulated box without touching this machine's /sys, /proc or /etc.
"""

from __future__ import annotations

import os
import posixpath
from typing import Mapping, Sequence

from .errors import InventoryError
from .inventory import Box, HostEntry
from .opsproviders import OPS_PROVIDERS, register_ops_provider  # noqa: F401
from .state import backup_path
from .transport.base import CmdResult, FileStat, Transport
from .transport.fsops import FileOps
from .transport.local import LocalTransport

BACKUP_LIMIT = 16 << 20  # the files gpubox rewrites are configs of a few KiB
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Host:
    def __init__(self, entry: HostEntry, transport: Transport, role: str = "host"):
        self.entry = entry
        self.name = entry.name
        self.transport = transport
        self.role = role  # "host" (Proxmox) or "container"
        self.root = entry.root
        transport.root = self.root or "/"  # the anchor of its local writes (gpubox.safepath)
        env = {str(k): str(v) for k, v in (entry.get("gpubox_env") or {}).items()}
        bins = entry.get("gpubox_bin_dirs") or []
        if isinstance(bins, str):
            bins = [bins]
        if bins:
            base = os.environ.get("PATH", DEFAULT_PATH) if transport.is_local else DEFAULT_PATH
            env["PATH"] = ":".join([*map(str, bins), env.get("PATH", base)])
        self.env = env

    # -- paths -----------------------------------------------------------------------------
    def path(self, logical: str) -> str:
        """Real path of a logical absolute path under this host's root prefix."""
        if not logical.startswith("/"):
            raise ValueError(f"logical paths are absolute: {logical!r}")
        if self.root in ("", "/"):
            return logical
        return posixpath.join(self.root, logical.lstrip("/"))

    @property
    def sysfs_pci(self) -> str:
        """For pciutils: `-A linux-sysfs -O sysfs.path=<this>`."""
        return self.path("/sys/bus/pci")

    # -- commands --------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        input: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
        check: bool = False,
        on_stderr=None,
        idle: float | None = None,
    ) -> CmdResult:
        merged = dict(self.env)
        if env:
            merged.update(env)
        kw = {"on_stderr": on_stderr} if on_stderr is not None else {}  # live stderr lines (transport.base)
        if idle is not None:
            kw["idle"] = idle
        r = self.transport.run(
            argv, timeout=timeout, input=input, env=merged or None, cwd=cwd, become=become, **kw
        )
        r.host = self.name
        return r.check() if check else r

    # -- files (logical paths) -------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        return self.transport.read_bytes(self.path(path))

    def read_text(self, path: str, default: str | None = None) -> str:
        try:
            data = self.read_bytes(path)
        except FileNotFoundError:
            if default is None:
                raise
            return default
        try:
            return data.decode()
        except UnicodeDecodeError as exc:  # a one-line cause naming the file, never "internal error"
            from .errors import not_utf8

            raise not_utf8(f"{self.name}:{path}", data, exc) from None

    def exists(self, path: str) -> bool:
        return self.transport.stat(self.path(path)) is not None

    def stat(self, path: str) -> FileStat | None:
        return self.transport.stat(self.path(path))

    def read_bounded(self, path: str, limit: int) -> bytes:
        """A file someone else could have written (a lock holder record): regular and bounded."""
        return self.transport.read_bounded(self.path(path), limit)

    def listdir(self, path: str) -> list[str]:
        return self.transport.listdir(self.path(path))

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.transport.makedirs(self.path(path), mode)

    def remove(self, path: str) -> None:
        self.transport.remove(self.path(path))

    def write(
        self,
        path: str,
        data: bytes | str,
        *,
        mode: int | None = None,
        backup: bool = True,
        tmp_name: str | None = None,
    ) -> str | None:
        """Atomic write with a timestamped backup of the old content on the control node.

        Returns the backup's path (None when there was nothing to back up)."""
        if isinstance(data, str):
            data = data.encode()
        saved = None
        if backup:
            try:
                # what is there, read as a file someone else may have replaced: a link, FIFO or
                # device at PATH is refused (one line) before anything is written
                old = self.read_bounded(path, BACKUP_LIMIT)
            except FileNotFoundError:
                old = None
            if old is not None:
                from .safeio import write_atomic

                # tmp + rename: ENOSPC in the backup directory leaves no 0-byte backup, and the
                # error names the file; nothing is written to the host without its backup.
                bp = write_atomic(backup_path(self.name, path), old, mode=0o600)
                saved = str(bp)
        real = self.path(path)
        parent = posixpath.dirname(real)
        if self.transport.stat(parent) is None:
            self.transport.makedirs(parent)
        self.transport.write_bytes_atomic(real, data, mode=mode, tmp_name=tmp_name)
        return saved

    def close(self) -> None:
        self.transport.close()

    def __repr__(self) -> str:
        return f"Host({self.name!r}, root={self.root!r}, via={type(self.transport).__name__})"


def transport_for(entry: HostEntry, *, via: "Host | None" = None, vmid: int | None = None) -> Transport:
    """Pick the transport from the host's variables.

    `gpubox_connection` (local | ssh | pct) wins, else `ansible_connection` (local | ssh; default
    ssh). `pct` needs the Proxmox host (`via`) and the container's vmid.
    """
    conn = str(entry.get("gpubox_connection") or entry.get("ansible_connection") or "ssh")
    if conn == "local":
        return LocalTransport(
            entry.name,
            become=str(entry.get("ansible_become", "")).lower() in ("1", "true", "yes"),
            ops=_local_ops(entry),
        )
    if conn in ("ssh", "paramiko", "ansible.builtin.ssh", "ansible.builtin.paramiko_ssh"):
        from .transport.ssh import SSHTransport

        return SSHTransport.from_vars(entry.name, entry.vars)
    if conn == "pct":
        from .transport.pct import PctTransport

        if via is None or vmid is None:
            raise InventoryError(
                f"{entry.name}: gpubox_connection pct needs gpubox_vmid and gpubox_proxmox_host",
                "set both, or use ssh",
            )
        return PctTransport(entry.name, via.transport, vmid, host_env=via.env)
    raise InventoryError(
        f"{entry.name}: unsupported connection {conn!r}",
        "use ansible_connection local or ssh, or gpubox_connection pct",
    )


def _local_ops(entry: HostEntry) -> FileOps | None:
    for provider in OPS_PROVIDERS:
        ops = provider(entry)
        if ops is not None:
            return ops
    return None


def connect(entry: HostEntry, role: str = "host") -> Host:
    return Host(entry, transport_for(entry), role)


def connect_box(box: Box) -> tuple[Host, Host]:
    """(Proxmox host, container) for a box; the container may be reached through `pct exec`."""
    host = connect(box.host, "host")
    ct = Host(box.container, transport_for(box.container, via=host, vmid=box.vmid), "container")
    return host, ct
