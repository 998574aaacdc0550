"""/etc/pve/lxc/<vmid>.conf: a parser/renderer that round-trips byte-for-byte, and the safe write.

Parsing follows pve-container's parse_pct_config (docs/facts.md "Proxmox LXC config"): lines before
the first `[...]` header are the main (current) config, `[pve:pending]` starts the pending
section, any other `[name]` a snapshot; raw `lxc.*` keys may be spelt `key: value` or
`key = value`; `#` lines are the description. Every line keeps its exact bytes, so rendering an
untouched file gives the same bytes and an edit touches only the lines it names.

We hand-write this instead of using a library: no maintained Python parser for the PVE format
exists, and proxmoxer's API cannot set raw `lxc.*` keys at all (the file must be edited).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from dataclasses import dataclass, field

from gpubox.errors import GpuboxError
from gpubox.state import backup_path

MAIN, PENDING = "main", "pve:pending"
MAX_BYTES = (
    1024 * 1024
)  # pmxcfs's limit per file: exactly this much is allowed (pve-cluster src/pmxcfs/memdb.h)
CONF_MODE = 0o640  # the only mode pmxcfs allows (pmxcfs.c cfs_fuse_chmod); never chmod/copystat there

# pve-container reads the file as bytes: its \s is ASCII whitespace, [a-z] with /i is ASCII, \d
# ASCII digits. re.ASCII gives Python the same classes (without it \s also matches U+2028, \x1c,
# \x85..., [a-z] with re.I matches the Kelvin sign).
_PENDING = re.compile(r"^\[pve:pending\]\s*$", re.I | re.A)
_SNAP = re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.I | re.A)
_LXC = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$", re.A)
_KEY = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$", re.A)
WS = " \t\n\v\f\r"  # Perl's \s on bytes, C's isspace(): the only whitespace Proxmox and LXC see
# What Python's str.splitlines() would also end a line at, and NUL: kept inside the line (as
# Proxmox keeps them) and named by `odd_characters`.
_ODD = re.compile("[\r\0\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_ODD_NAMES = {
    "\r": "a carriage return (CR)",
    "\0": "a NUL byte",
    "\x0b": "a vertical tab",
    "\x0c": "a form feed",
    "\x1c": "a file separator (0x1c)",
    "\x1d": "a group separator (0x1d)",
    "\x1e": "a record separator (0x1e)",
    "\x85": "a next-line character (U+0085)",
    "\u2028": "a line separator (U+2028)",
    "\u2029": "a paragraph separator (U+2029)",
}


def split_lines(text: str) -> list[str]:
    """The file's lines with their endings, split on \\n only, as pve-container's parse_pct_config
    does (`split(/\\n/, $raw)`, src/PVE/LXC/Config.pm). str.splitlines() would also split on CR,
    U+2028 and others, and so read a comment's tail as a rule Proxmox never sees (or the reverse)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def fields(value: str) -> list[str]:
    """A value's blank-separated fields as LXC splits them (ASCII whitespace only)."""
    return [f for f in re.split(f"[{WS}]+", value) if f]


def odd_characters(raw: str) -> list[str]:
    """Characters in one line that another line splitter would end the line at (a CR other than
    the CR of a CRLF ending, U+2028...), or NUL: what a person reading it may not see."""
    body = raw[:-2] if raw.endswith("\r\n") else raw[:-1] if raw.endswith("\n") else raw
    return sorted({_ODD_NAMES[c] for c in _ODD.findall(body)})


@dataclass
class Line:
    raw: str  # exact text including its line ending (the last line may have none)
    key: str | None = None
    value: str | None = None
    eq: bool = False  # spelt `key = value`

    @property
    def is_lxc(self) -> bool:
        return bool(self.key and self.key.startswith("lxc."))

    @property
    def blank(self) -> bool:
        return not self.raw.strip(WS)


def parse_line(raw: str) -> Line:
    text = raw.rstrip("\r\n")
    if not text.strip(WS) or text.startswith("#"):
        return Line(raw)
    m = _LXC.match(text)
    if m:
        return Line(raw, m.group(1), m.group(3), m.group(2) != ":")
    m = _KEY.match(text)
    if m:
        return Line(raw, m.group(1), m.group(2))
    return Line(raw)  # unknown shape: kept as it is


@dataclass
class Section:
    name: str
    header: str = ""  # exact header line ("" for main)
    lines: list[Line] = field(default_factory=list)

    def values(self, key: str) -> list[str]:
        return [l.value for l in self.lines if l.key == key and l.value is not None]

    def get(self, key: str) -> str | None:
        v = self.values(key)
        return v[0] if v else None

    def render(self) -> str:
        return self.header + "".join(l.raw for l in self.lines)


@dataclass
class LxcConf:
    sections: list[Section]

    @classmethod
    def parse(cls, text: str) -> "LxcConf":
        sections = [Section(MAIN)]
        for raw in split_lines(text):
            stripped = raw.rstrip("\r\n")
            if _PENDING.match(stripped):
                sections.append(Section(PENDING, raw))
                continue
            m = _SNAP.match(stripped)
            if m:
                sections.append(Section(m.group(1), raw))
                continue
            sections[-1].lines.append(parse_line(raw))
        return cls(sections)

    def render(self) -> str:
        return "".join(s.render() for s in self.sections)

    @property
    def main(self) -> Section:
        return self.sections[0]

    @property
    def pending(self) -> Section | None:
        return next((s for s in self.sections if s.name == PENDING), None)

    @property
    def snapshots(self) -> list[str]:
        return [s.name for s in self.sections[1:] if s.name != PENDING]

    @property
    def lock(self) -> str | None:
        return self.main.get("lock")

    def eq_style(self) -> bool:
        """Whether new lxc lines should be spelt `key = value` (as the file's main lxc lines are)."""
        lx = [l for l in self.main.lines if l.is_lxc]
        return bool(lx) and all(l.eq for l in lx)


def format_line(key: str, value: str, eq: bool = False) -> Line:
    raw = f"{key} = {value}\n" if eq and key.startswith("lxc.") else f"{key}: {value}\n"
    return parse_line(raw)


def digest(data: bytes | str) -> str:
    """SHA-1 of the file, as the Proxmox API's `digest`."""
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha1(data).hexdigest()


def conf_path(vmid: int) -> str:
    return f"/etc/pve/lxc/{int(vmid)}.conf"


def lock_path(vmid: int) -> str:
    # pve-container 94f5585 src/PVE/LXC/Config.pm config_file_lock ("$lockdir/pve-config-${vmid}.lock",
    # $lockdir = /run/lock/lxc); pve-common Tools.pm lock_file_full: flock(LOCK_EX) on it opened
    # for append, 10 s default timeout, the same as _write_local below.
    return f"/run/lock/lxc/pve-config-{int(vmid)}.lock"


def read_conf(host, vmid: int) -> tuple[LxcConf, str]:
    path = conf_path(vmid)
    try:
        raw = host.read_bytes(path)
    except FileNotFoundError:
        raise GpuboxError(
            f"{host.name}: {path} does not exist",
            f"check gpubox_vmid ({vmid}) and that the container exists (pct list)",
        ) from None
    return LxcConf.parse(raw.decode()), digest(raw)


# -- safe write ------------------------------------------------------------------------------------
#
# /etc/pve is pmxcfs on every Proxmox host (pve-cluster src/pmxcfs/): renameat2's RENAME_EXCHANGE
# and RENAME_NOREPLACE fail EINVAL there, chmod to anything but 0640 and chown fail EPERM, a file
# may hold 1 MiB, a vmid that is already a guest elsewhere is refused EEXIST, and without quorum
# every write fails EACCES. So the one commit path is Proxmox's own (pve-common File.pm
# file_set_contents): `<file>.tmp.<pid>`, then rename(); gpubox re-reads the file under the lock
# just before the rename and once more after it.

PMXCFS_GID = 33  # www-data on Debian: pmxcfs shows it as every entry's group (pmxcfs.c cfs.gid)
NO_QUORUM = "/etc/pve is read-only: this node has no quorum (pvecm status)"
NO_QUORUM_FIX = "bring the cluster back to quorum, then re-run; nothing was written"

_REMOTE_COMMIT = (  # constant script; every input arrives as a positional argument ($1..$4)
    'set -e; [ -L "$1" ] && { echo "is a symbolic link" >&2; exit 4; }; '
    '[ "$(sha1sum < "$1" | cut -c1-40)" = "$2" ] || { echo "changed since check" >&2; exit 3; }; '
    'mv -f -- "$3" "$1"; '
    '[ "$(sha1sum < "$1" | cut -c1-40)" = "$4" ] || { echo "changed after the rename" >&2; exit 5; }'
)


def _refuse_without_quorum(host, path: str) -> None:
    """pmxcfs shows every file 0440 (directories 0555) while the node has no quorum, and refuses
    every write with EACCES (pve-cluster src/pmxcfs/cfs-plug-memdb.c tree_entry_stat): say so
    before anything is written, the backup included."""
    if no_quorum(host.stat(path)):
        raise GpuboxError(NO_QUORUM, NO_QUORUM_FIX)


def no_quorum(st) -> bool:
    """Whether a file under /etc/pve (its FileStat) shows as pmxcfs shows files while the node has
    no quorum: root:www-data without the owner's write bit (0440)."""
    return st is not None and st.is_file and st.gid == PMXCFS_GID and not st.perms & 0o200


def _save_backup(host, path: str, old: bytes) -> str:
    """The old file on the control node before anything changes on the host: a backup directory
    that is full (ENOSPC) or unwritable stops the write with the config unchanged."""
    from gpubox.safeio import write_atomic

    try:
        return str(write_atomic(backup_path(host.name, path), old, mode=0o600))
    except GpuboxError as exc:
        raise GpuboxError(
            f"{path} not changed: its backup could not be written: {exc.problem}", exc.fix
        ) from None
    except OSError as exc:
        raise GpuboxError(
            f"{path} not changed: its backup could not be written: {exc.strerror or exc}",
            "free space in gpubox's state directory (or set GPUBOX_STATE_DIR), then re-run",
        ) from None


def _os_failure(exc: OSError, host, path: str, vmid: int) -> GpuboxError:
    """What pmxcfs's refusals mean, in one line."""
    import errno

    if exc.errno == errno.EACCES:
        st = host.stat(path)
        if st is None or not st.perms & 0o200:
            return GpuboxError(NO_QUORUM, NO_QUORUM_FIX)
    if exc.errno == errno.EEXIST:
        return GpuboxError(
            f"{path}: pmxcfs refuses it: VMID {vmid} is also a VM or a container on another node (File exists)",
            "check `pvesh get /cluster/resources --type vm`; the file was not changed",
        )
    if exc.errno == errno.EFBIG:
        return GpuboxError(f"{path}: the new config is over pmxcfs's 1 MiB per file", "shorten the file")
    from gpubox.errors import os_error

    return os_error(exc)


def _refuse_if_changed_or_locked(host, path: str, old: bytes, expect_digest: str) -> None:
    if digest(old) != expect_digest:
        raise GpuboxError(
            f"{path} changed since it was checked (digest {digest(old)[:12]} != {expect_digest[:12]})",
            "someone else edited it: re-run to check again",
        )
    lock = LxcConf.parse(old.decode()).lock
    if lock:
        raise GpuboxError(
            f"{path} is locked ({lock})",
            "wait for the backup/snapshot/migration to finish; `pct unlock` only if none runs",
        )


def _changed_after(path: str, got: bytes) -> GpuboxError:
    return GpuboxError(
        f"{path} changed right after it was replaced (digest {digest(got)[:12]} is not what gpubox "
        "wrote): another writer without Proxmox's lock; the other edit is kept",
        "look at the file and who writes it, then re-run",
    )


def _rename(ops, src: str, dst: str) -> bool:
    """The commit point (a seam the crash test cuts at): an atomic exchange where the filesystem
    can (True: `src` now holds the file swapped out), else rename() as Proxmox commits (False:
    always so on pmxcfs, whose rename takes no flags: EINVAL)."""
    if ops.exchange(src, dst):
        return True
    ops.replace(src, dst)
    return False


def _commit(host, ops, path: str, tmp: str, real: str, expect_digest: str, data: bytes) -> None:
    """Put `tmp` in place of `real` unless `real` changed since `check` read it, and prove it took.

    Under Proxmox's lock: the file is re-read right before the commit (a writer that holds the
    lock cannot have changed it since). On pmxcfs the commit is rename(); afterwards the file is
    re-read and compared with what was written, so a writer that ignores the lock and wrote after
    the rename is caught (its edit is kept, gpubox's reported as not in place). Where the
    filesystem has RENAME_EXCHANGE (a plain directory), the file swapped out is checked too and
    swapped back if someone wrote it between the re-read and the swap; pmxcfs leaves that window
    (microseconds, lock-ignoring writers only) open, as it does for Proxmox's own writes."""
    _refuse_if_changed_or_locked(host, path, ops.read_bytes(real), expect_digest)
    if _rename(ops, tmp, real):
        was = ops.read_bytes(tmp)  # what we just swapped out
        if digest(was) != expect_digest:
            ops.exchange(tmp, real)  # give the file back as the other writer left it
            raise GpuboxError(
                f"{path} changed while it was being replaced (digest {digest(was)[:12]} != "
                f"{expect_digest[:12]}): not replaced, the other edit is kept",
                "someone edited it without Proxmox's lock: re-run to check again",
            )
        ops.unlink(tmp)
    got = ops.read_bytes(real)
    if got != data:
        raise _changed_after(path, got)


def _refuse_symlink(real: str, path: str) -> None:
    """pmxcfs has no symlinks but its own `lxc` -> `nodes/<node>/lxc` (docs/lxc.md), so a linked
    config file is not a Proxmox-managed file: replacing the link by a regular file would leave its
    target with the old lines. Policy: refuse, say so."""
    if os.path.islink(real):
        raise GpuboxError(
            f"{path} is a symbolic link (to {os.readlink(real)}): not replacing it with a regular file",
            "Proxmox's /etc/pve has no symlinks: point gpubox_root at the real "
            "config or replace the link by the file, then re-run",
        )


def write_conf(host, vmid: int, text: str, expect_digest: str, *, lock_timeout: float = 10) -> str:
    """Replace the container config the way Proxmox does; returns the backup's path.

    Refuses a node without quorum and a `lock:`ed config before anything is written; takes
    Proxmox's lock file; saves the backup (a full backup directory stops here); writes
    `<file>.tmp.<pid>` in the same directory (no chmod/copystat: pmxcfs refuses them); re-reads the
    file under the lock just before rename() and aborts if its digest differs from `expect_digest`
    (what `check` read); re-reads it after the rename and fails if it is not what was written. A
    crash at any point leaves the old or the new file, never a mix; a leftover temp of a killed
    run is removed by the next (`gpubox.provision.confjournal`).
    """
    data = text.encode()
    if len(data) > MAX_BYTES:
        raise GpuboxError(f"new config is {len(data)} bytes", "pmxcfs files hold at most 1 MiB")
    new = LxcConf.parse(text)
    if new.render() != text:  # cannot happen; guards the renderer
        raise GpuboxError("internal: config does not round-trip", "report this")
    path = conf_path(vmid)
    real = host.path(path)
    tmp = f"{real}.tmp.{os.getpid()}"  # pve-common src/PVE/File.pm file_set_contents: "$filename.tmp.$$"
    _refuse_without_quorum(host, path)
    if host.transport.is_local:
        _refuse_symlink(real, path)
        return _write_local(host, vmid, path, real, tmp, data, expect_digest, lock_timeout)
    return _write_remote(host, vmid, path, real, tmp, data, expect_digest, lock_timeout)


def _write_local(host, vmid, path, real, tmp, data, expect_digest, lock_timeout) -> str:
    import fcntl
    import time

    from gpubox.transport.fsops import POSIX
    from gpubox.transport.local import write_all

    from . import confjournal

    ops = getattr(host.transport, "ops", POSIX)
    lock_real = host.path(lock_path(vmid))
    os.makedirs(os.path.dirname(lock_real), exist_ok=True)
    with open(lock_real, "a") as lk:
        deadline = time.monotonic() + lock_timeout
        while True:
            try:
                fcntl.flock(lk, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GpuboxError(
                        f"{lock_path(vmid)} is held by another process",
                        "a Proxmox task is changing the container: re-run when it is done",
                    ) from None
                time.sleep(0.1)
        confjournal.sweep(host, vmid)
        old = ops.read_bytes(real)
        _refuse_if_changed_or_locked(host, path, old, expect_digest)
        saved = _save_backup(host, path, old)
        with confjournal.writing(host, vmid, tmp):
            try:
                fd = ops.open(
                    tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, CONF_MODE
                )
            except FileExistsError:
                raise GpuboxError(
                    f"{path}.tmp.{os.getpid()} exists and is not a temp of a gpubox run that ended",
                    "another writer's temp: re-run when it is gone",
                ) from None
            except OSError as exc:
                raise _os_failure(exc, host, path, vmid) from None
            try:
                try:
                    write_all(ops, fd, data)
                    ops.fsync(fd)
                finally:
                    ops.close(fd)
                _refuse_symlink(real, path)
                _commit(host, ops, path, tmp, real, expect_digest, data)
            except BaseException as exc:
                if os.path.lexists(tmp):
                    try:
                        ops.unlink(tmp)
                    except OSError:
                        pass
                if isinstance(exc, OSError):
                    raise _os_failure(exc, host, path, vmid) from None
                raise
        return saved


def _write_remote(host, vmid, path, real, tmp, data, expect_digest, lock_timeout) -> str:
    from . import confjournal

    confjournal.sweep(host, vmid)
    old = host.read_bytes(path)
    _refuse_if_changed_or_locked(host, path, old, expect_digest)
    saved = _save_backup(host, path, old)
    with confjournal.writing(host, vmid, tmp):
        try:
            # 0640: what pmxcfs shows whatever is asked; the transport makes no chmod where the
            # new file has it already, and accepts a refused chmod that left it no more open.
            host.transport.write_bytes_atomic(tmp, data, mode=CONF_MODE)
        except OSError as exc:
            raise _os_failure(exc, host, path, vmid) from None
        lock_real = host.path(lock_path(vmid))
        host.run(["mkdir", "-p", posixpath.dirname(lock_real)], become=True)
        r = host.run(
            [
                "flock",
                "-w",
                str(int(lock_timeout)),
                lock_real,
                "sh",
                "-c",
                _REMOTE_COMMIT,
                "sh",
                real,
                expect_digest,
                tmp,
                digest(data),
            ],
            become=True,
            timeout=lock_timeout + 30,
        )
        if r.rc != 0:
            host.run(["rm", "-f", "--", tmp], become=True)
            if r.rc == 4:
                raise GpuboxError(
                    f"{path} is a symbolic link: not replacing it with a regular file",
                    "Proxmox's /etc/pve has no symlinks: replace the link by the file, then re-run",
                )
            if r.rc == 3:
                raise GpuboxError(
                    f"{path} changed since it was checked", "someone else edited it: re-run to check again"
                )
            if r.rc == 5:
                raise _changed_after(path, host.read_bytes(path))
            if "Permission denied" in r.stderr:
                _refuse_without_quorum(host, path)
            if "File exists" in r.stderr:
                raise _os_failure(OSError(17, "File exists"), host, path, vmid)
            r.check()
    return saved
