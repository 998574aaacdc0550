"""Files gpubox writes on the control node outside a box's owned paths: reports, plots, result
documents, history stores, Prometheus textfiles. One way to write them, and one temp-file name.

- Never through what is already there (gpubox.safepath does every write): a new file is created
  next to the target with O_CREAT|O_EXCL|O_NOFOLLOW in a directory fd reached with no link
  followed beneath its anchor (the state directory for everything in it, else the directory the
  caller named), and renamed over the target; rename(2) replaces a symlink at the target instead
  of following it, so a planted `DIR/report.md -> ~/.ssh/authorized_keys` is replaced, its target
  untouched, and a planted `<state>/history -> /etc` is refused. Appends open with
  O_APPEND|O_NOFOLLOW beneath the same anchor.
- Recognisable temps: `.<name>.gpubox.tmp.<pid>.<random>`. A run killed between create and
  rename leaves one; `clean_stale(dir)` (called by the next writer into that directory) removes
  those whose pid no longer runs here and says which.
- Errors name the file: an OSError from write(2) carries no file name (ENOSPC, EDQUOT, EROFS,
  EIO), so it is re-raised with the target's path and turned into the one-line GpuboxError.
- `staged(out_dir)`: a set of files (a report with its plots) written into a temp directory and
  moved in only when all of them are done; an error leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

from . import safepath
from .errors import GpuboxError, os_error
from .safepath import NODE_TAG, TMP_TAG, is_tmp, tmp_name, written_here  # noqa: F401 - one temp name

_TMP = safepath.TMP_RE


def _named(exc: OSError, path) -> OSError:
    if exc.filename is None:
        return OSError(exc.errno, exc.strerror or str(exc), os.fspath(path))
    return exc


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid runs on this machine (EPERM: it runs, as another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temps(directory: str | os.PathLike) -> list[Path]:
    """gpubox temps in DIRECTORY whose writer (by pid) no longer runs on this machine."""
    d = Path(directory)
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return []
    for n in names:
        m = _TMP.match(n)
        if m and int(m.group("pid")) != os.getpid() and not pid_alive(int(m.group("pid"))):
            out.append(d / n)
    return sorted(out)


def clean_stale(directory: str | os.PathLike) -> list[str]:
    """Remove the stale temps of DIRECTORY (a killed run's); returns what was removed. Each is
    removed relative to the directory's fd, and only when it is ours (a file or a `staged`
    directory of this euid, never through a link)."""
    removed = []
    stale = stale_temps(directory)
    if not stale:
        return removed
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        for p in stale:
            try:
                st = safepath.entry(dfd, p.name)
                if st is None or st.st_uid != os.geteuid():
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(p)  # fd-based: nothing beneath is followed (shutil._rmtree_safe_fd)
                else:
                    safepath.remove_entry(dfd, p.name, str(p))
                removed.append(str(p))
            except (OSError, GpuboxError):
                continue
    finally:
        os.close(dfd)
    return removed


def sweep_state() -> list[str]:
    """Stale temps anywhere in the state directory (a killed run's, in a directory nothing may
    write again soon: lxc-owned, backups/<host>): removed once per locked run (gpubox.boxlock)."""
    from .state import state_root

    removed: list[str] = []
    root = state_root()
    for dirpath, dirnames, _files in os.walk(root):  # os.walk follows no directory link
        dirnames[:] = [d for d in dirnames if not is_tmp(d)]
        removed += clean_stale(dirpath)
    return removed


def _roots() -> list[str]:
    """Directories gpubox owns on the control node: files beneath them are reached from them with
    no link followed (the state directory: backups, results, history, verdict stores)."""
    from .state import state_root

    return [str(state_root())]


def _anchor(path: str | os.PathLike) -> tuple[safepath.Anchor, str]:
    """The Anchor PATH is written beneath (the state directory when it lies there, else the
    directory it is in, which the caller named) and PATH relative to it."""
    a, rel = safepath.anchor_of(os.fspath(path), _roots())
    try:
        return safepath.Anchor(a, create=a in _roots(), mode=0o700), rel
    except OSError as exc:
        raise os_error(_named(exc, a)) from None


def write_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Create PATH with DATA: a new file (never opened through a link) renamed into place, every
    directory beneath the anchor reached without following a link (gpubox.safepath)."""
    path = Path(path)
    anchor, rel = _anchor(path)
    try:
        clean_stale(path.parent)
        safepath.write(anchor, rel, data, mode)
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    finally:
        anchor.close()
    return path


def write_text(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    return write_atomic(path, text.encode(), mode)


def append(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Append DATA to PATH (created when absent), never through a link at any component."""
    anchor, rel = _anchor(path)
    try:
        safepath.append(anchor, rel, data, mode)
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    finally:
        anchor.close()


def open_fd(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """os.open(PATH, FLAGS) beneath PATH's anchor with no link followed at any component (a lock
    file, a store read): a planted `<state>/history -> /etc` is refused, never opened through.
    FileNotFoundError is raised as it is; any other OSError as the one-line GpuboxError."""
    anchor, rel = _anchor(path)
    try:
        return anchor.open(rel, flags | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        raise  # absent is an answer the caller handles (a store not written yet)
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    finally:
        anchor.close()


def makedirs(path: str | os.PathLike, mode: int = 0o755) -> Path:
    """Make directory PATH and its missing parents beneath its anchor, no link followed."""
    anchor, rel = _anchor(path)
    try:
        os.close(anchor.makedirs(rel, mode))
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    finally:
        anchor.close()
    return Path(path)


def open_append(path: str | os.PathLike):
    """PATH opened for appending as a binary file object (a server's log): created when absent,
    never through a link at any component beneath its anchor, a regular file only."""
    anchor, rel = _anchor(path)
    try:
        fd = anchor.open(rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise safepath.Refused(str(path), "is not a regular file", "move it away and re-run")
        os.set_blocking(fd, True)
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    finally:
        anchor.close()
    return os.fdopen(fd, "ab")


@contextmanager
def staged(out_dir: str | os.PathLike):
    """Yield a private directory inside OUT_DIR; on success move every file in it to OUT_DIR (each
    by renameat into a directory fd reached from OUT_DIR with no link followed; a link at a file's
    own name is replaced, never followed), on any error remove it all."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc) from None
    if out.is_symlink():
        raise GpuboxError(f"{out} is a symlink", "give the real directory")
    clean_stale(out)
    tmp = out / tmp_name("staged")
    try:
        os.mkdir(tmp, 0o700)
    except OSError as exc:
        raise os_error(_named(exc, tmp)) from None
    try:
        yield tmp
        files = sorted(p for p in tmp.rglob("*") if not p.is_dir())
        with safepath.Anchor(out) as anchor:
            for p in files:  # everything checked before anything moves
                rel = str(p.relative_to(tmp))
                d, name = os.path.split(rel)
                try:
                    dfd = anchor.opendir(d)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise os_error(_named(exc, out / rel)) from None
                try:
                    st = safepath.entry(dfd, name)
                finally:
                    os.close(dfd)
                if st is not None and stat.S_ISDIR(st.st_mode):
                    raise os_error(IsADirectoryError(21, "Is a directory", str(out / rel)))
            for p in files:
                rel = str(p.relative_to(tmp))
                d, name = os.path.split(rel)
                dfd = anchor.makedirs(d)
                try:
                    os.replace(p, name, dst_dir_fd=dfd)
                finally:
                    os.close(dfd)
            os.fsync(anchor.fd)
    except OSError as exc:
        raise os_error(_named(exc, out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
