"""Files gpubox writes on the control node outside a box's owned paths: reports, plots, result
documents, history stores, Prometheus textfiles. One way to write them, and one temp-file name.

- Never through what is already there: a new file is created next to the target with
  O_CREAT|O_EXCL|O_NOFOLLOW (open(2): O_EXCL fails on any existing name, a symlink included) and
  renamed over the target; rename(2) replaces a symlink at the target instead of following it,
  so a planted `DIR/report.md -> ~/.ssh/authorized_keys` is replaced, its target untouched.
  Appends open with O_APPEND|O_NOFOLLOW (ELOOP on a symlink).
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
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import GpuboxError, os_error

TMP_TAG = ".gpubox.tmp."
_TMP = re.compile(r"^\.(?P<name>.+)\.gpubox\.tmp\.(?P<pid>[0-9]+)\.[0-9a-f]+$")


def tmp_name(target: str | os.PathLike, pid: int | None = None) -> str:
    """The temp file's basename for TARGET (same directory): recognisable, unique, hidden."""
    base = os.path.basename(os.fspath(target))[:180]
    return f".{base}{TMP_TAG}{pid or os.getpid()}.{secrets.token_hex(4)}"


def is_tmp(name: str) -> bool:
    return bool(_TMP.match(os.path.basename(name)))


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
    """Remove the stale temps of DIRECTORY (a killed run's); returns what was removed."""
    removed = []
    for p in stale_temps(directory):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(str(p))
        except OSError:
            continue
    return removed


def write_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Create PATH with DATA: a new file (never opened through a symlink) renamed into place."""
    path = Path(path)
    d = path.parent
    if path.is_dir() and not path.is_symlink():
        raise os_error(IsADirectoryError(21, "Is a directory", str(path)))
    clean_stale(d)
    tmp = d / tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise os_error(_named(exc, tmp)) from None
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise os_error(_named(exc, path)) from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_dir(d)
    return path


def _write_all(fd: int, data: bytes) -> None:
    """All of DATA to FD (write(2) may take less than asked), then fsync: on disk before use."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def write_text(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    return write_atomic(path, text.encode(), mode)


def append(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Append DATA to PATH (created when absent), never through a symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    try:
        _write_all(fd, data)
    except OSError as exc:
        raise os_error(_named(exc, path)) from None
    finally:
        os.close(fd)


def _sync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def staged(out_dir: str | os.PathLike):
    """Yield a private directory inside OUT_DIR; on success move every file in it to OUT_DIR (each
    by rename, replacing symlinks rather than following them), on any error remove it all."""
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
        os.mkdir(tmp, 0o755)
    except OSError as exc:
        raise os_error(_named(exc, tmp)) from None
    try:
        yield tmp
        files = sorted(p for p in tmp.rglob("*") if not p.is_dir())
        for p in files:  # everything checked before anything moves
            target = out / p.relative_to(tmp)
            for parent in list(target.relative_to(out).parents)[:-1]:
                if (out / parent).is_symlink():
                    raise GpuboxError(f"{out / parent} is a symlink", "remove it, or choose another -o DIR")
            if target.is_dir() and not target.is_symlink():
                raise os_error(IsADirectoryError(21, "Is a directory", str(target)))
        for p in files:
            target = out / p.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, target)
        _sync_dir(out)
    except OSError as exc:
        raise os_error(_named(exc, out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
