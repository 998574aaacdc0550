"""The simulated host's `/etc/pve`: Proxmox's cluster filesystem (pmxcfs), as the code meets it.

pmxcfs is a FUSE filesystem (pve-cluster `src/pmxcfs/`); what it refuses decides which path a
writer takes on a real host, so the simulated `/etc/pve` refuses the same, by default:

- layout: `lxc`, `local` and `qemu-server` are symlinks to `nodes/<node>/...` (pmxcfs.c creates
  them as link plugs: `cfs_plug_link_new`);
- every entry shows root:www-data, files 0640 (0600 under `priv/`), directories 0755 (0700 under
  `priv/`) whatever mode was asked; without quorum files show 0440 and directories 0555
  (cfs-plug-memdb.c `tree_entry_stat` masked by pmxcfs.c `cfs_fuse_getattr`; cfs-utils.c
  `path_is_private`); mtimes are whole seconds (memdb keeps a 32-bit `mtime`);
- chmod to any mode other than 0640 (0600 in `priv/`) and chown to anything but root:www-data:
  EPERM (pmxcfs.c `cfs_fuse_chmod`, `cfs_fuse_chown`);
- hard links EPERM, symlinks and FIFOs ENOSYS, xattrs ENOTSUP: no such operations in pmxcfs.c's
  `fuse_ops` (FUSE answers ENOSYS, the kernel turns a missing link op into EPERM);
- renameat2 with RENAME_EXCHANGE or RENAME_NOREPLACE: EINVAL (FUSE 2's rename takes no flags);
  a plain rename works;
- a file may hold exactly 1 MiB: a write past it fails EFBIG, the part before it stays
  (memdb.h `MEMDB_MAX_FILE_SIZE`, memdb.c `memdb_write`; the kernel splits a large write, so one
  call comes back short);
- `nodes/<node>/{lxc,qemu-server}/<vmid>.conf` whose vmid is already a guest of another type or
  on another node: EEXIST, on create and as a rename's target (memdb.c `vmlist_different_vm_exists`);
  the renamed file stays where it was;
- no quorum: every write, create, rename, unlink and mkdir fails EACCES; reads work (memdb.c and
  cfs-plug-memdb.c check `cfs_is_quorate`).

The simulated host's local transport makes its file calls through `PmxcfsOps` (the host's
`gpubox.transport.fsops.FileOps`); the quorum is the simulated state's `pmxcfs.quorate`.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

from gpubox.transport.fsops import FileOps

MAX_FILE = 1024 * 1024  # memdb.h MEMDB_MAX_FILE_SIZE
WWW_DATA = 33  # Debian's www-data gid: pmxcfs shows every entry with it (cfs.gid)
LINKS = {"lxc": "lxc", "qemu-server": "qemu-server", "local": ""}  # /etc/pve/<name> -> nodes/<node>/<x>
_VM_CONF = re.compile(r"^nodes/([^/]+)/(lxc|qemu-server|openvz)/([1-9][0-9]*)\.conf$")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _err(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


class PmxcfsOps(FileOps):
    """FileOps with pmxcfs's rules under `<root>/etc/pve` (the module docstring lists them); the
    kernel's own everywhere else. `quorate` is read from the simulated box's state at each write,
    so a test or fault can take the quorum away from a running box."""

    def __init__(self, root: str | os.PathLike, state_file: str | os.PathLike | None = None):
        self.root = os.path.abspath(root)
        self.mount = os.path.join(self.root, "etc/pve")
        self.state_file = Path(state_file) if state_file else Path(self.root).parent / "sim.json"
        self._fds: dict[int, str] = {}

    # -- where and what ----------------------------------------------------------------------
    def inside(self, path: str | os.PathLike) -> bool:
        p = os.path.abspath(os.fspath(path))
        return p == self.mount or p.startswith(self.mount + "/")

    def claims(self, path) -> bool:
        return self.inside(path)

    def rel(self, path: str | os.PathLike) -> str:
        """The path inside pmxcfs with the links resolved (`lxc/200.conf` -> `nodes/pve1/lxc/200.conf`)."""
        p = os.path.abspath(os.fspath(path))
        head, tail = os.path.split(p)
        r = os.path.relpath(os.path.join(os.path.realpath(head), tail), os.path.realpath(self.mount))
        return "" if r == "." else r

    def private(self, path) -> bool:
        r = self.rel(path)
        return r == "priv" or r.startswith("priv/") or bool(re.match(r"^nodes/[^/]+/priv(/|$)", r))

    def quorate(self) -> bool:
        try:
            return bool(json.loads(self.state_file.read_text()).get("pmxcfs", {}).get("quorate", True))
        except (OSError, ValueError):
            return True

    def _writable(self, path) -> None:
        if self.inside(path) and not self.quorate():
            raise _err(errno.EACCES, os.fspath(path))

    def shown_mode(self, path, is_dir: bool, is_link: bool = False) -> int:
        """The permission bits pmxcfs shows (pmxcfs.c cfs_fuse_getattr over tree_entry_stat)."""
        q = self.quorate()
        base = 0o777 if (is_dir or is_link) else 0o666
        if not q and not is_link:
            base = 0o555 if is_dir else 0o444
        return base & (0o700 if self.private(path) else (0o755 if is_dir or is_link else 0o750))

    def vm_clash(self, path) -> bool:
        """Whether creating PATH (a guest config) clashes with the same vmid elsewhere."""
        m = _VM_CONF.match(self.rel(path))
        if not m:
            return False
        node, kind, vmid = m.groups()
        nodes = Path(self.mount) / "nodes"
        for other in nodes.iterdir() if nodes.is_dir() else []:
            for k in ("lxc", "qemu-server", "openvz"):
                if (other.name, k) != (node, kind) and (other / k / f"{vmid}.conf").exists():
                    return True
        return False

    def settle(self, path) -> None:
        """Give a real entry the owner, mode and whole-second mtime pmxcfs shows (so plain os
        calls on the simulated tree see what they would see on a real host)."""
        st = os.lstat(path)
        if os.path.islink(path):
            os.lchown(path, 0, WWW_DATA)
            return
        is_dir = os.path.isdir(path)
        os.chown(path, 0, WWW_DATA)
        os.chmod(path, self.shown_mode(path, is_dir))
        os.utime(path, (int(st.st_atime), int(st.st_mtime)))

    # -- FileOps -----------------------------------------------------------------------------
    def lstat(self, path) -> os.stat_result:
        st = os.lstat(path)
        if not self.inside(path):
            return st
        import stat as _st

        is_dir, is_link = _st.S_ISDIR(st.st_mode), _st.S_ISLNK(st.st_mode)
        mode = _st.S_IFMT(st.st_mode) | self.shown_mode(path, is_dir, is_link)
        t = int(st.st_mtime)
        return os.stat_result((mode, st.st_ino, st.st_dev, st.st_nlink, 0, WWW_DATA, st.st_size, t, t, t))

    def open(self, path, flags: int, mode: int = 0o644) -> int:
        if not self.inside(path):
            return os.open(path, flags, mode)
        if flags & _WRITE_FLAGS:
            self._writable(path)
        new = bool(flags & os.O_CREAT) and not os.path.lexists(path)
        if new and self.vm_clash(path):
            raise _err(errno.EEXIST, os.fspath(path))
        fd = os.open(path, flags, 0o600)
        if new:
            self.settle(path)
        self._fds[fd] = os.fspath(path)
        return fd

    def write(self, fd: int, data) -> int:
        path = self._fds.get(fd)
        if path is None:
            return os.write(fd, data)
        self._writable(path)
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        if pos + len(data) > MAX_FILE:
            if pos >= MAX_FILE:
                raise _err(errno.EFBIG, path)
            data = bytes(data[: MAX_FILE - pos])  # the kernel's first pieces land; the call is short
        return os.write(fd, data)

    def close(self, fd: int) -> None:
        path = self._fds.pop(fd, None)
        os.close(fd)
        if path is not None and os.path.lexists(path):
            st = os.lstat(path)
            os.utime(path, (int(st.st_atime), int(st.st_mtime)))

    def mkdir(self, path, mode: int = 0o755) -> None:
        if not self.inside(path):
            return os.mkdir(path, mode)
        self._writable(path)
        os.mkdir(path, 0o700)
        self.settle(path)

    def unlink(self, path) -> None:
        self._writable(path)
        os.unlink(path)

    def replace(self, src, dst) -> None:
        a, b = self.inside(src), self.inside(dst)
        if not (a or b):
            return os.replace(src, dst)
        if a != b:
            raise _err(errno.EXDEV, os.fspath(dst))
        self._writable(dst)
        if self.vm_clash(dst):
            raise _err(errno.EEXIST, os.fspath(dst))
        os.replace(src, dst)
        self.settle(dst)

    def rename2(self, src, dst, flags: int) -> None:
        if self.inside(src) or self.inside(dst):
            raise _err(errno.EINVAL, os.fspath(dst))
        super().rename2(src, dst, flags)

    def chmod(self, path, mode: int) -> None:
        if not self.inside(path):
            return os.chmod(path, mode)
        if (mode & 0o7777) != (0o600 if self.private(path) else 0o640):
            raise _err(errno.EPERM, os.fspath(path))

    def chown(self, path, uid: int, gid: int) -> None:
        if not self.inside(path):
            return os.chown(path, uid, gid)
        if uid not in (0, -1) or gid not in (WWW_DATA, -1):
            raise _err(errno.EPERM, os.fspath(path))

    def link(self, src, dst) -> None:
        if self.inside(src) or self.inside(dst):
            raise _err(errno.EPERM, os.fspath(dst))
        os.link(src, dst)

    def symlink(self, target, path) -> None:
        if self.inside(path):
            raise _err(errno.ENOSYS, os.fspath(path))
        os.symlink(target, path)

    def mkfifo(self, path, mode: int = 0o600) -> None:
        if self.inside(path):
            raise _err(errno.ENOSYS, os.fspath(path))
        os.mkfifo(path, mode)

    def setxattr(self, path, name: str, value: bytes) -> None:
        if self.inside(path):
            raise _err(errno.ENOTSUP, os.fspath(path))
        os.setxattr(path, name, value)

    def utime(self, path, times) -> None:
        if self.inside(path):
            self._writable(path)
            times = (int(times[0]), int(times[1]))
        os.utime(path, times)


def ops_for(entry) -> PmxcfsOps | None:
    """The file rules of a simulated box's Proxmox host (gpubox.host.register_ops_provider): its
    `/etc/pve` is pmxcfs; any other host is left to the kernel."""
    root = entry.root
    if entry.get("gpubox_simulated") is not True or root in ("", "/"):
        return None
    if not os.path.isdir(os.path.join(root, "etc/pve")):
        return None
    return PmxcfsOps(root)


def build_tree(root: str | os.PathLike, node: str) -> None:
    """`<root>/etc/pve` as pmxcfs shows a fresh node: `nodes/<node>/{lxc,qemu-server,priv}`,
    `priv/`, and the `lxc`, `local`, `qemu-server` links."""
    pve = Path(root) / "etc/pve"
    for d in (f"nodes/{node}/lxc", f"nodes/{node}/qemu-server", f"nodes/{node}/priv", "priv"):
        (pve / d).mkdir(parents=True, exist_ok=True)
    for name, sub in LINKS.items():
        link = pve / name
        if not link.is_symlink():
            os.symlink(f"nodes/{node}/{sub}".rstrip("/"), link)
    settle_tree(root)


def settle_tree(root: str | os.PathLike) -> None:
    """Owner, modes and whole-second mtimes of every entry under `<root>/etc/pve`, as pmxcfs shows
    them (after the builder wrote files with plain os calls)."""
    ops = PmxcfsOps(root)
    for dirpath, dirnames, filenames in os.walk(ops.mount):
        for n in dirnames + filenames:
            ops.settle(os.path.join(dirpath, n))
    ops.settle(ops.mount)


def set_quorate(sim, quorate: bool) -> None:
    """Give or take the simulated node's quorum (a cluster node whose corosync lost the others)."""
    with sim.state() as st:
        st.setdefault("pmxcfs", {})["quorate"] = bool(quorate)
    settle_tree(sim.host_root)
