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
MAX_BYTES = 1024 * 1024  # pmxcfs limit per file (docs/facts.md)
CONF_MODE = 0o640  # the only mode pmxcfs allows; never chmod/copystat there (docs/facts.md)

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

_REMOTE_COMMIT = (  # constant script; every input arrives as a positional argument ($1..$3)
    'set -e; [ -L "$1" ] && { echo "is a symbolic link" >&2; exit 4; }; '
    '[ "$(sha1sum < "$1" | cut -c1-40)" = "$2" ] || { echo "changed since check" >&2; exit 3; }; '
    'mv -f -- "$3" "$1"'
)


def _rename(src: str, dst: str) -> bool:
    """The commit point (a seam the crash test cuts at): an atomic exchange where the kernel and
    filesystem can (True: `src` now holds the old file), else a plain rename (False)."""
    if _exchange(src, dst):
        return True
    os.replace(src, dst)
    return False


_RENAME_EXCHANGE = 2  # linux include/uapi/linux/fcntl.h


def _exchange(a: str, b: str) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two paths atomically. False where the filesystem or
    kernel cannot (pmxcfs is FUSE and may refuse it; then the plain re-check + rename is used)."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), b)


def _commit(host, path: str, tmp: str, real: str, expect_digest: str) -> None:
    """Put `tmp` in place of `real` unless `real` changed since `check` read it.

    The file is re-read right before the commit; where the kernel can, the commit is an atomic
    exchange and the file swapped out is checked once more afterwards, then swapped back if
    someone wrote it in between without the lock (their edit is kept, ours refused). This closes
    the window between the last re-read and rename() that a plain rename leaves open."""
    with open(real, "rb") as f:  # re-read just before the commit
        again = f.read()
    _refuse_if_changed_or_locked(host, path, again, expect_digest)
    if not _rename(tmp, real):
        return
    with open(tmp, "rb") as f:  # what we just swapped out
        was = f.read()
    if digest(was) != expect_digest:
        _exchange(tmp, real)  # give the file back as the other writer left it
        raise GpuboxError(
            f"{path} changed while it was being replaced (digest {digest(was)[:12]} != "
            f"{expect_digest[:12]}): not replaced, the other edit is kept",
            "someone edited it without Proxmox's lock: re-run to check again",
        )
    os.unlink(tmp)


def _refuse_symlink(real: str, path: str) -> None:
    """pmxcfs has no symlinks (docs/facts.md), so a linked config is not a Proxmox-managed file: replacing
    the link by a regular file would leave its target with the old lines. Policy: refuse, say so."""
    if os.path.islink(real):
        raise GpuboxError(
            f"{path} is a symbolic link (to {os.readlink(real)}): not replacing it with a regular file",
            "Proxmox's /etc/pve has no symlinks: point gpubox_root at the real "
            "config or replace the link by the file, then re-run",
        )


def write_conf(host, vmid: int, text: str, expect_digest: str, *, lock_timeout: float = 10) -> str:
    """Replace the container config the way Proxmox does; returns the backup's path.

    Refuses a `lock:`ed config; takes Proxmox's lock file; writes `<file>.tmp.<pid>` in the same
    directory (mode 0640, no chmod/copystat: pmxcfs refuses them); re-reads the file under the lock
    just before rename() and aborts if its digest differs from `expect_digest` (what `check`
    read). A crash at any point leaves the old or the new file, never a mix.
    """
    data = text.encode()
    if len(data) >= MAX_BYTES:
        raise GpuboxError(f"new config is {len(data)} bytes", "pmxcfs files must stay under 1 MiB")
    new = LxcConf.parse(text)
    if new.render() != text:  # cannot happen; guards the renderer
        raise GpuboxError("internal: config does not round-trip", "report this")
    path = conf_path(vmid)
    real = host.path(path)
    tmp = f"{real}.tmp.{os.getpid()}"  # pve-common src/PVE/File.pm file_set_contents: "$filename.tmp.$$"
    if host.transport.is_local:
        _refuse_symlink(real, path)
        return _write_local(host, vmid, path, real, tmp, data, expect_digest, lock_timeout)
    return _write_remote(host, vmid, path, real, tmp, data, expect_digest, lock_timeout)


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


def _write_local(host, vmid, path, real, tmp, data, expect_digest, lock_timeout) -> str:
    import fcntl
    import time

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
        with open(real, "rb") as f:
            old = f.read()
        _refuse_if_changed_or_locked(host, path, old, expect_digest)
        saved = backup_path(host.name, path)
        saved.write_bytes(old)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, CONF_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            _refuse_symlink(real, path)
            _commit(host, path, tmp, real, expect_digest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return str(saved)


def _write_remote(host, vmid, path, real, tmp, data, expect_digest, lock_timeout) -> str:
    old = host.read_bytes(path)
    _refuse_if_changed_or_locked(host, path, old, expect_digest)
    saved = backup_path(host.name, path)
    saved.write_bytes(old)
    host.transport.write_bytes_atomic(tmp, data, mode=CONF_MODE)
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
        r.check()
    return str(saved)
