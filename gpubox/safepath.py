"""The one safe-path layer under every write gpubox makes on a machine it runs on.

One module (about 540 lines) on purpose: every rule of the layer (resolution, anchors, writes,
removes, bounded reads) is reviewed together, as the hostile oracles test it.

gpubox runs as root where others can write (a container's /dev/shm is mode 1777; a state or lock
directory may have been made by someone else first). A name someone else could have planted must
never make gpubox write, truncate, chmod or delete another file. So every write here:

- starts from an ANCHOR, a directory gpubox opened itself and trusts (the host's root prefix, the
  state directory, an output directory the user named), and reaches the target relative to that
  directory's fd, never by a path string the kernel resolves again later;
- follows no symbolic link at any component beneath the anchor: openat2(2) with
  RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH (Linux >= 5.6) where the kernel has it, else a walk of one
  component at a time, each opened O_NOFOLLOW|O_DIRECTORY relative to the one before (both are
  tested: GPUBOX_NO_OPENAT2=1 forces the walk);
- changes files through fds it created: a new file is made O_CREAT|O_EXCL|O_NOFOLLOW next to the
  target, written, fchmod'ed and fsync'ed, then renameat(2)'d over the target inside the same
  directory fd (rename replaces a planted link at the last component instead of following it);
  nothing is ever truncated or chmod'ed by name;
- unlinks with unlinkat(2) relative to the directory fd, after fstatat(AT_SYMLINK_NOFOLLOW) showed
  the entry is what gpubox expects (a regular file of ours);
- keeps its own working files in a world-writable directory only inside a directory it made
  itself, owned by it and mode 0700 (`private_dir`), checked on every open;
- judges the canonical path (`canonical`: `//`, `/./`, `..` and a trailing `/` removed): with no
  link allowed beneath the anchor, the lexical form IS the resolved one.

A refusal is `Refused` (a GpuboxError: exit 2, one line naming the path and why); nothing was
changed when it is raised.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import re
import secrets
import socket
import stat as _stat
from contextlib import contextmanager

from .errors import GpuboxError

LINK_WHY = "is a symbolic link: gpubox does not write through links it did not make"

# openat2(2): struct open_how and RESOLVE_* from include/uapi/linux/openat2.h; the syscall number is
# 437 on every architecture (the unified syscall table since Linux 5.1, arch/*/entry/syscalls).
SYS_OPENAT2 = 437
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


TMP_TAG = ".gpubox.tmp."
TMP_RE = re.compile(r"^\.(?P<name>.+)\.gpubox\.tmp\.(?P<pid>[0-9]+)\.[0-9a-f]+$")


# Which machine wrote a temp: its random part starts with this tag, so a later run on the same
# machine can tell its own dead writers (the pid no longer runs here) from another control node's
# (an SSH writer's pid means nothing in this process table).
NODE_TAG = hashlib.sha256(socket.gethostname().encode(errors="replace")).hexdigest()[:8]


def tmp_name(target: str | os.PathLike, pid: int | None = None) -> str:
    """The temp file's basename for TARGET (same directory): recognisable, unique, hidden."""
    base = os.path.basename(os.fspath(target))[:180]
    return f".{base}{TMP_TAG}{pid or os.getpid()}.{NODE_TAG}{secrets.token_hex(4)}"


def written_here(name: str) -> int | None:
    """The writer's pid when NAME is a temp this machine wrote, else None."""
    m = TMP_RE.match(os.path.basename(name))
    if not m or not name.rsplit(".", 1)[-1].startswith(NODE_TAG):
        return None
    return int(m.group("pid"))


def is_tmp(name: str) -> bool:
    return bool(TMP_RE.match(os.path.basename(name)))


class Refused(GpuboxError):
    """A path gpubox will not write through (a planted link, a foreign or shared directory)."""

    def __init__(self, path: str, why: str, fix: str | None = None):
        super().__init__(f"{path} {why}", fix or "remove it (or choose another path) and re-run")
        self.path = path


_libc = None
_how = None


def _open_how():
    """struct open_how, made when first needed: a python without ctypes (a minimal container's)
    uses the walk, which needs nothing but os."""
    global _how
    if _how is None:
        import ctypes

        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

        _how = OpenHow
    return _how


_openat2_ok: bool | None = None


def _syscall():
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.syscall


def have_openat2() -> bool:
    """Whether openat2(2) is used (the kernel has it, and GPUBOX_NO_OPENAT2 is not set)."""
    global _openat2_ok
    if os.environ.get("GPUBOX_NO_OPENAT2", "").strip() not in ("", "0"):
        return False
    if _openat2_ok is None:
        try:
            fd = _openat2(os.open("/", _DIR_FLAGS), ".", _DIR_FLAGS, 0, close_dir=True)
            os.close(fd)
            _openat2_ok = True
        except OSError:  # ENOSYS (older kernel), EPERM (a seccomp filter): the walk does the same
            _openat2_ok = False
        except (AttributeError, TypeError, ImportError):  # no ctypes or no libc syscall(): the walk
            _openat2_ok = False
    return _openat2_ok


def _openat2(dirfd: int, rel: str, flags: int, mode: int, close_dir: bool = False) -> int:
    import ctypes

    how = _open_how()(
        flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH
    )
    try:
        fd = _syscall()(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(os.fsencode(rel)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), rel)
        return fd
    finally:
        if close_dir:
            os.close(dirfd)


def canonical(path: str) -> str:
    """The path as the kernel reaches it when no link is on the way: `//`, `/./`, `..`, trailing `/`
    gone (posixpath.normpath keeps a leading `//`, which POSIX leaves implementation-defined and
    Linux reads as `/`)."""
    p = posixpath.normpath(os.fspath(path))
    if p.startswith("//"):
        p = "/" + p.lstrip("/")
    return p


def relative(anchor: str, path: str) -> str:
    """PATH relative to ANCHOR (both judged canonical); refused when PATH is not beneath it."""
    a, p = canonical(anchor), canonical(path)
    if p == a:
        return "."
    prefix = a if a.endswith("/") else a + "/"
    if not p.startswith(prefix):
        raise Refused(path, f"is outside {anchor}", "gpubox writes only beneath its own directories")
    return p[len(prefix) :]


def _parts(rel: str) -> list[str]:
    out = []
    for c in canonical("/" + rel).split("/"):
        if c in ("", "."):
            continue
        out.append(c)
    return out


def _blame(anchor_fd: int, anchor: str, parts: list[str], exc: OSError) -> Exception:
    """Turn ELOOP/ENOTDIR/EXDEV from a no-links open into the line naming the component that is a
    link (found with fstatat, no link followed), else the OSError itself."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV, errno.EMLINK):
        return exc
    fd = os.dup(anchor_fd)
    try:
        for i, c in enumerate(parts):
            here = posixpath.join(anchor, *parts[: i + 1])
            try:
                st = os.stat(c, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return exc
            if _stat.S_ISLNK(st.st_mode):
                return Refused(here, LINK_WHY)
            if i == len(parts) - 1 or not _stat.S_ISDIR(st.st_mode):
                break
            nfd = os.open(c, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return exc


def open_at(anchor_fd: int, rel: str, flags: int, mode: int = 0o600, *, anchor: str = "") -> int:
    """open(2) REL beneath the directory ANCHOR_FD, no link followed at any component (the last
    included: O_NOFOLLOW); `..` may not climb out. ANCHOR is the anchor's path, for messages."""
    parts = _parts(rel)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=anchor_fd)
    try:
        if have_openat2():
            return _openat2(anchor_fd, "/".join(parts), flags | os.O_NOFOLLOW, mode)
        return _walk(anchor_fd, parts, flags, mode)
    except OSError as exc:
        raise _blame(anchor_fd, anchor, parts, exc) from None


def _walk(anchor_fd: int, parts: list[str], flags: int, mode: int) -> int:
    fd = anchor_fd
    try:
        for c in parts[:-1]:
            nfd = os.open(c, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            if fd != anchor_fd:
                os.close(fd)
            fd = nfd
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        if fd != anchor_fd:
            os.close(fd)


class Anchor:
    """A directory gpubox trusts, opened once (following links: it is configuration, the host's
    root prefix or the state directory), and everything beneath it reached without links."""

    def __init__(self, path: str | os.PathLike, create: bool = False, mode: int = 0o755):
        self.path = canonical(os.fspath(path))
        if create:
            os.makedirs(self.path, mode=mode, exist_ok=True)
        self.fd = os.open(self.path, _DIR_FLAGS)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Anchor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def name(self, rel: str) -> str:
        return posixpath.join(self.path, *_parts(rel)) if _parts(rel) else self.path

    def open(self, rel: str, flags: int, mode: int = 0o600) -> int:
        return open_at(self.fd, rel, flags, mode, anchor=self.path)

    def opendir(self, rel: str) -> int:
        """An fd of the directory REL (no link followed); ENOENT when absent."""
        return self.open(rel, _DIR_FLAGS)

    def makedirs(self, rel: str, mode: int = 0o755) -> int:
        """Make REL and its missing parents (mkdirat, no link followed); returns its fd."""
        fd = os.dup(self.fd)
        done: list[str] = []
        try:
            for c in _parts(rel):
                done.append(c)
                try:
                    os.mkdir(c, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    nfd = os.open(c, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    raise _blame(self.fd, self.path, done, exc) from None
                os.close(fd)
                fd = nfd
            out, fd = fd, -1
            return out
        finally:
            if fd >= 0:
                os.close(fd)


def _split(rel: str) -> tuple[str, str]:
    parts = _parts(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", rel)
    return "/".join(parts[:-1]), parts[-1]


@contextmanager
def _parent(anchor: Anchor, rel: str, create: bool):
    d, name = _split(rel)
    dfd = anchor.makedirs(d) if create else anchor.opendir(d)
    try:
        yield dfd, name
    finally:
        os.close(dfd)


def entry(dfd: int, name: str) -> os.stat_result | None:
    """fstatat(AT_SYMLINK_NOFOLLOW) of NAME in DFD, None when absent."""
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def write(
    anchor: Anchor,
    rel: str,
    data: bytes,
    mode: int | None = 0o644,
    *,
    tmp: str | None = None,
    create_dirs: bool = True,
    keep_mode: bool = False,
    link_ok: bool = True,
) -> None:
    """Atomically make REL (beneath ANCHOR) hold DATA: a new temp in the same directory fd, written,
    fchmod'ed, fsync'ed, renamed over REL, directory fsync'ed. KEEP_MODE keeps an existing file's
    permissions (read with fstatat, never through a link). A link at REL itself is replaced, never
    followed (LINK_OK=False refuses it instead); a directory there is refused (EISDIR)."""
    with _parent(anchor, rel, create_dirs) as (dfd, name):
        old = entry(dfd, name)
        if old is not None and _stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", anchor.name(rel))
        if old is not None and _stat.S_ISLNK(old.st_mode) and not link_ok:
            raise Refused(anchor.name(rel), LINK_WHY)
        if keep_mode and old is not None and _stat.S_ISREG(old.st_mode):
            mode = _stat.S_IMODE(old.st_mode)
        mode = 0o644 if mode is None else mode
        tname = tmp or tmp_name(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tname, flags, mode, dir_fd=dfd)
        except FileExistsError:
            if not tmp:
                raise
            remove_entry(dfd, tname, anchor.name(posixpath.join(posixpath.dirname(rel), tname)))
            fd = os.open(tname, flags, mode, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if _stat.S_IMODE(os.fstat(fd).st_mode) != mode:  # the umask took bits away
                    os.fchmod(fd, mode)  # through our fd, never by name (pmxcfs: never needed)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tname, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            try:
                os.unlink(tname, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(exc, OSError) and exc.filename is None:  # write(2)/fsync(2) name no file
                raise OSError(exc.errno, exc.strerror or str(exc), anchor.name(rel)) from None
            raise
        try:
            os.fsync(dfd)
        except OSError:
            pass


def append(anchor: Anchor, rel: str, data: bytes, mode: int = 0o644) -> None:
    """Append DATA to REL (created when absent), the file opened with no link followed anywhere;
    only a regular file is appended to."""
    with _parent(anchor, rel, True) as (dfd, name):
        fd = os.open(
            name,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            mode,
            dir_fd=dfd,
        )
        try:
            if not _stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused(anchor.name(rel), "is not a regular file", "move it away and re-run")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            if exc.filename is None:
                raise OSError(exc.errno, exc.strerror or str(exc), anchor.name(rel)) from None
            raise
        finally:
            os.close(fd)


def remove_entry(dfd: int, name: str, shown: str, *, owner: int | None = None) -> bool:
    """unlinkat NAME in DFD when it is a regular file or a link (a link's target is never
    touched) owned by OWNER (default: this process's euid); False when absent. A directory or
    someone else's file is refused."""
    st = entry(dfd, name)
    if st is None:
        return False
    if not (_stat.S_ISREG(st.st_mode) or _stat.S_ISLNK(st.st_mode)):
        raise Refused(shown, "is not a regular file: gpubox removes only files it wrote")
    want = os.geteuid() if owner is None else owner
    if st.st_uid != want:
        raise Refused(shown, f"belongs to uid {st.st_uid}: gpubox removes only files it wrote")
    os.unlink(name, dir_fd=dfd)
    return True


def remove(anchor: Anchor, rel: str, *, owner: int | None = None) -> bool:
    """Remove REL beneath ANCHOR (see remove_entry); a missing parent means nothing to remove."""
    try:
        with _parent(anchor, rel, False) as (dfd, name):
            return remove_entry(dfd, name, anchor.name(rel), owner=owner)
    except FileNotFoundError:
        return False


def read(anchor: Anchor, rel: str, limit: int) -> bytes:
    """REL's bytes, a regular file only (a FIFO, device or socket is refused without blocking:
    O_NONBLOCK, then fstat) and at most LIMIT bytes (more is refused, never read into memory)."""
    fd = anchor.open(rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        return read_fd(fd, anchor.name(rel), limit)
    finally:
        os.close(fd)


def read_fd(fd: int, shown: str, limit: int) -> bytes:
    st = os.fstat(fd)
    if not _stat.S_ISREG(st.st_mode):
        raise Refused(shown, "is not a regular file", "gpubox reads only regular files there; move it away")
    chunks, size = [], 0
    while True:
        b = os.read(fd, min(1 << 20, limit + 1 - size))
        if not b:
            break
        chunks.append(b)
        size += len(b)
        if size > limit:
            raise Refused(
                shown, f"is larger than {limit} bytes", "it is not a file gpubox wrote; move it away"
            )
    return b"".join(chunks)


def private_dir(anchor: Anchor, rel: str) -> int:
    """An fd of REL, a directory gpubox made itself for its working files in a shared place (mode
    0700, owned by this euid): made when absent; refused when it is a link, not a directory, someone
    else's, or open to others."""
    with _parent(anchor, rel, True) as (dfd, name):
        try:
            os.mkdir(name, 0o700, dir_fd=dfd)
        except FileExistsError:
            pass
        return check_private(dfd, name, anchor.name(rel))


def check_private(dfd: int, name: str, shown: str) -> int:
    st = entry(dfd, name)
    if st is not None and _stat.S_ISLNK(st.st_mode):
        raise Refused(shown, LINK_WHY)
    fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
    st = os.fstat(fd)
    why = None
    if st.st_uid != os.geteuid():
        why = f"belongs to uid {st.st_uid}, not to gpubox (uid {os.geteuid()})"
    elif _stat.S_IMODE(st.st_mode) & 0o077:
        why = f"is mode {_stat.S_IMODE(st.st_mode):04o}, open to others"
    if why:
        os.close(fd)
        raise Refused(shown, f"{why}: gpubox keeps its working files only in a 0700 directory it made")
    return fd


def writable_by_others(st: os.stat_result) -> bool:
    """Whether someone other than the owner may create names in a directory of this stat."""
    return bool(_stat.S_IMODE(st.st_mode) & 0o022)


# Links the system itself makes on the way to a directory gpubox writes, followed only to where
# they must lead: pmxcfs' /etc/pve/lxc -> nodes/<node>/lxc (a FUSE file system only root writes).
SYSTEM_LINKS = {"/etc/pve/lxc": "/etc/pve"}


def system_anchor(path: str, root: str = "/") -> tuple[str, str] | None:
    """(anchor, rel) for PATH beneath one of SYSTEM_LINKS (under ROOT): the link resolved, and
    refused unless it stays inside the tree it belongs to; None when PATH is beneath none."""
    p, root = canonical(path), canonical(root)
    for link, inside in SYSTEM_LINKS.items():
        where = canonical(posixpath.join(root, link.lstrip("/")))
        if p != where and not p.startswith(where + "/"):
            continue
        real = os.path.realpath(where)
        tree = os.path.realpath(posixpath.join(root, inside.lstrip("/")))
        if real != tree and not real.startswith(tree + "/"):
            raise Refused(where, f"leads to {real}, outside {tree}", "it should be Proxmox's own link")
        return real, relative(where, p)
    return None


def system_link_ok(want: str, got: str, root: str = "/") -> bool:
    """Whether a remote path WANT that resolves to GOT differs only by one of SYSTEM_LINKS, which
    may resolve only inside its tree (a remote `realpath -m` check)."""
    want, got, root = canonical(want), canonical(got), canonical(root)
    for link, inside in SYSTEM_LINKS.items():
        where = canonical(posixpath.join(root, link.lstrip("/")))
        tree = canonical(posixpath.join(root, inside.lstrip("/")))
        if (want == where or want.startswith(where + "/")) and got.startswith(tree + "/"):
            return True
    return False


def anchor_of(path: str, roots: list[str]) -> tuple[str, str]:
    """(anchor, relative path) for PATH: the longest of ROOTS it lies beneath, else its parent
    directory (a directory the caller named: trusted, the file itself still never followed)."""
    p = canonical(path)
    best = ""
    for r in roots:
        r = canonical(r)
        if (p == r or p.startswith(r.rstrip("/") + "/")) and len(r) > len(best):
            best = r
    if not best:
        best = posixpath.dirname(p) or "/"
    return best, relative(best, p)
