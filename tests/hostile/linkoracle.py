"""The oracles of issue 37's write side: record every path gpubox touches, plant a link there.

`Recorder` is a Python audit hook (sys.addaudithook, PEP 578) that records, while switched on,
every path this process opens, renames, removes, makes, chmods or truncates; a path given relative
to a directory fd (gpubox.safepath works that way) is resolved through /proc/self/fd. Only
gpubox's own process is recorded: the simulator's stand-in commands are other processes.

`Box` is a pristine simulated box copied (cp -a: its device nodes too) into a working directory
for each run, with its own state directory, so every planted run starts from the same box.

`plan_plants` turns the recorded paths into the names to replace by a link: every path written and
each of its parent directories beneath the box's roots and the state directory, grouped by kind
(lock, state, backup, unit, boot, config, nccl, prom, staging, ...) and, unless
GPUBOX_ORACLE_FULL=1, sampled deterministically: up to `per_kind` of every kind, spread over the
sorted list, so every kind is tried on every run of the suite.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
FULL = os.environ.get("GPUBOX_ORACLE_FULL", "").strip() not in ("", "0")


class Recorder:
    """The audit hook: one per process (hooks cannot be removed), switched on and off."""

    _installed: "Recorder | None" = None

    def __init__(self) -> None:
        self.on = False
        self.written: set[str] = set()
        self.read: set[str] = set()

    @classmethod
    def get(cls) -> "Recorder":
        if cls._installed is None:
            cls._installed = cls()
            sys.addaudithook(cls._installed._hook)
        return cls._installed

    def start(self) -> None:
        self.written, self.read, self.on = set(), set(), True

    def stop(self) -> None:
        self.on = False

    @staticmethod
    def _resolve(path, dir_fd) -> str | None:
        if isinstance(path, int):
            try:
                return os.readlink(f"/proc/self/fd/{path}")
            except OSError:
                return None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return None
        path = os.fspath(path)
        if os.path.isabs(path):
            return os.path.normpath(path)
        if dir_fd is None:
            return os.path.normpath(os.path.join(os.getcwd(), path))
        try:
            return os.path.normpath(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path))
        except OSError:
            return None

    def _hook(self, event: str, args) -> None:
        if not self.on:
            return
        try:
            if event == "open":
                path, _mode, flags = args
                if not isinstance(path, int) and (isinstance(path, bytes) or os.path.isabs(os.fspath(path))):
                    p = self._resolve(path, None)
                    (self.written if (flags or 0) & WRITE_FLAGS else self.read).add(p)
            elif event == "os.rename":
                src, dst, sfd, dfd = args
                self.written.update(x for x in (self._resolve(src, sfd), self._resolve(dst, dfd)) if x)
            elif event in ("os.remove", "os.rmdir"):
                p = self._resolve(args[0], args[1])
                if p:
                    self.written.add(p)
            elif event in ("os.mkdir", "os.chmod", "os.chown"):
                p = self._resolve(args[0], args[-1])
                if p:
                    self.written.add(p)
            elif event in ("os.truncate", "shutil.rmtree", "os.symlink", "os.link", "os.utime"):
                p = self._resolve(args[0], None)
                if p:
                    self.written.add(p)
        except Exception:  # noqa: BLE001 - a recorder must never change what it records
            pass


@dataclass
class Box:
    """A pristine simulated box and the working copy each run gets."""

    base: Path
    faults: tuple = ()
    work: Path = field(init=False)
    pristine: Path = field(init=False)
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        from gpubox.simbox import build

        self.work = self.base / "box"
        self.pristine = self.base / "pristine"
        self.state = self.base / "state"
        self.sim = build(self.work, self.faults)
        self.extra()
        subprocess.run(["cp", "-a", str(self.work), str(self.pristine)], check=True)

    def extra(self) -> None:
        """Inventory additions every run needs (none by default)."""

    def reset(self) -> None:
        """The working box and state directory as they were before any run."""
        for d in (self.work, self.state):
            if d.is_symlink() or d.is_file():
                d.unlink()
            elif d.exists():
                subprocess.run(["rm", "-rf", "--", str(d)], check=True)
        subprocess.run(["cp", "-a", str(self.pristine), str(self.work)], check=True)
        self.state.mkdir(mode=0o700)

    @property
    def roots(self) -> dict[str, Path]:
        return {"host": self.work / self.sim.host, "ct": self.work / self.sim.box, "state": self.state}


def kind(box: Box, path: str) -> str:
    """What a path is, by where it lies: the unit of sampling."""
    for where, root in box.roots.items():
        r = str(root)
        if path == r or path.startswith(r + "/"):
            rel = path[len(r) :].lstrip("/")
            break
    else:
        return "outside"
    if where == "state":
        top = rel.split("/", 1)[0]
        if top.startswith("recover-") or top.startswith(".recover-"):
            return "state:recover"
        return f"state:{top or '.'}"
    if where == "ct" and rel == "dev":
        return "ct:staging"  # the container's /dev is LXC's mount on a real box; only /dev/shm is gpubox's
    if rel.startswith("dev/shm/"):
        name = rel.rsplit("/", 1)[-1]
        for tag, k in (
            ("gpubox-stage", "lock"),
            (".partial", "partial"),
            ("journal", "journal"),
            ("manifest", "manifest"),
        ):
            if tag in rel:
                return f"{where}:staging-{k}"
        return f"{where}:staging-{'dest' if rel.count('/') == 2 else 'file'}" if name else f"{where}:staging"
    table = [
        ("run/lock", "lock"),
        ("dev/shm", "staging"),
        ("mnt/", "staging-src"),
        ("etc/pve", "config"),
        ("etc/systemd", "unit"),
        ("etc/cron.d", "unit"),
        ("etc/modules-load.d", "boot"),
        ("etc/modprobe.d", "boot"),
        ("etc/udev", "boot"),
        ("etc/sysctl.d", "boot"),
        ("usr/local/lib/sysctl.d", "boot"),
        ("etc/nccl.conf", "nccl"),
        ("etc/gpubox", "nccl"),
        ("var/lib/prometheus", "prom"),
        ("var/lib/gpubox", "history"),
    ]
    for prefix, k in table:
        if rel.startswith(prefix):
            return f"{where}:{k}"
    return f"{where}:other"


def plan_plants(
    box: Box, written: set[str], per_kind: int, skip_kinds=(), anchors: list[str] | None = None
) -> list[tuple[str, str]]:
    """(kind, path) of every name to replace by a link: each written path and its parents beneath
    the roots (not the roots themselves), or beneath ANCHORS when given (a command given paths by
    the user, `stage SRC DEST`, trusts what is above the directory it was given, as a real
    /dev/shm -> /run/shm is followed); sampled per kind unless FULL."""
    roots = {str(r) for r in box.roots.values()} if anchors is None else set(anchors)
    names: set[str] = set()
    for p in written:
        if kind(box, p) == "outside" or not any(p.startswith(r + "/") for r in roots):
            continue
        while p not in roots and p != "/":
            names.add(p)
            p = os.path.dirname(p)
    by_kind: dict[str, list[str]] = {}
    for p in sorted(names):
        k = kind(box, p)
        if not any(k.endswith(s) for s in skip_kinds):
            by_kind.setdefault(k, []).append(p)
    out = []
    for k in sorted(by_kind):
        ps = sorted(by_kind[k], key=lambda x: (x.count("/"), x))
        if not FULL and len(ps) > per_kind:
            # deepest (the file itself) and shallowest (its top directory) first, then spread
            step = (len(ps) - 1) / max(1, per_kind - 1)
            ps = [ps[-1 - round(i * step)] for i in range(per_kind)]
        out += [(k, p) for p in ps]
    return out


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry beneath ROOT (ROOT included): type, mode, owner, size, mtime, content digest."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in [".", *dirnames, *filenames]:
            p = os.path.join(dirpath, n) if n != "." else dirpath
            if n == "." and dirpath != str(root):
                continue
            st = os.lstat(p)
            digest = None
            if stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            out[os.path.relpath(p, root)] = (
                stat.S_IFMT(st.st_mode),
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_size,
                st.st_mtime_ns,
                digest,
            )
    return out


class Victims:
    """A victim file and a victim directory (with a file in it) that no run may change."""

    def __init__(self, base: Path):
        self.dir = base / "victims"
        self.dir.mkdir(parents=True)
        self.file = self.dir / "victim-file"
        self.file.write_text("victim: gpubox must never write here\n")
        self.file.chmod(0o640)
        self.tree = self.dir / "victim-dir"
        self.tree.mkdir(mode=0o751)
        (self.tree / "inside").write_text("victim's own file\n")
        os.utime(self.file, (1_000_000_000, 1_000_000_000))
        self.before = snapshot(self.dir)

    def changed(self) -> dict:
        now = snapshot(self.dir)
        keys = set(now) | set(self.before)
        return {k: (self.before.get(k), now.get(k)) for k in sorted(keys) if self.before.get(k) != now.get(k)}


def plant(path: str, victims: Victims, was_dir: bool) -> None:
    """Replace PATH (whatever stands there, if anything) by a link to a victim of its type."""
    p = Path(path)
    if p.is_symlink() or p.is_file() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victims.tree if was_dir else victims.file, p)


def clean_outcome(rc: int, err: str) -> str | None:
    """None when the run ended cleanly (0/1, or 2 with one line and no traceback), else why not."""
    if "Traceback" in err or "internal error" in err:
        return f"traceback/internal error (rc {rc}): {err.strip()[-600:]}"
    if rc in (0, 1):
        return None
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("gpubox: warning:")]
        return None if len(lines) == 1 else f"exit 2 with {len(lines)} lines: {err.strip()[-600:]}"
    return f"exit {rc}: {err.strip()[-600:]}"
