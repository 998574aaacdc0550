"""One lock per box, held on the box's Proxmox host, for every front end.

Every change to a box (lxc fix, recover, tune, stage: the step engine takes it in apply mode, so no
command can forget it) and every measurement of it (bench, the scheduled run-once) holds this lock.
A lock in the control node's state directory excluded only runs that shared that directory: the
timer (state in /var/lib/gpubox) and an operator's `recover` both changed the box at once. So the
lock lives where the box is:

    <host root>/run/lock/gpubox/ct<vmid>.lock      flock(2)ed by `flock(1)` running on the host
    <host root>/run/lock/gpubox/ct<vmid>.holder    who holds it (JSON), written after taking it

taken through the host's transport (local, SSH, or pct's host) as one long-running command,
`flock -w WAIT -E 75 LOCK sh -c 'echo "locked $PPID"; exec cat'`: flock holds the lock while `cat`
waits on stdin. Releasing closes stdin. If the holder dies however it dies (SIGKILL, a dead control
node, a dropped SSH connection) its pipe or channel closes, `cat` reads EOF, flock exits and the
kernel drops the lock: there is no stale lock, only possibly a stale holder record, which is
recognised (its host-side pid is gone) and reported instead of trusted. /run/lock is a tmpfs on
Debian/Proxmox, so a reboot clears both; pve-container keeps its own config locks in the same
directory tree (/run/lock/lxc/pve-config-<vmid>.lock). The lock is named by vmid on that host,
so two control nodes that call the host differently still meet on one file.

A second taker waits up to $GPUBOX_LOCK_WAIT seconds (default 5) and then refuses with one line
naming the holder (exit 2). Re-entrant within a process (recover runs steps that run steps) and
handed to child processes through $GPUBOX_BOX_LOCK_HELD (run-once's `gpubox bench` child).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import stat
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from .errors import GpuboxError, TransportError, os_error

HELD_ENV = "GPUBOX_BOX_LOCK_HELD"
WAIT_ENV = "GPUBOX_LOCK_WAIT"
LOCK_DIR = "/run/lock/gpubox"
BUSY = 75  # flock -E: "could not take it in time" (EX_TEMPFAIL), told apart from flock's own errors
_SCRIPT = 'echo "locked $PPID"; exec cat'  # constant: no input is ever spliced into it
_held: dict[str, int] = {}
_mutex = threading.Lock()


@dataclass
class LockInfo:
    """What the caller learns: where the lock is and any stale record it replaced."""

    path: str
    key: str
    stale: dict | None = None
    swept: list[str] | None = None  # temps a killed run left on the box, removed now


def lock_paths(vmid: int) -> tuple[str, str]:
    """(lock file, holder record): logical paths on the Proxmox host."""
    return f"{LOCK_DIR}/ct{int(vmid)}.lock", f"{LOCK_DIR}/ct{int(vmid)}.holder"


MAX_WAIT_S = 86400.0  # a day: longer is a typo, and flock -w takes no inf/nan
RECORD_LIMIT = 64 << 10  # a holder record is ~200 bytes; more is not one of ours


def _wait_s() -> float:
    """$GPUBOX_LOCK_WAIT as seconds: a finite number in [0, a day], else one line and exit 2
    (inf, nan, -1 or 1e400 would reach flock -w or time arithmetic as nonsense)."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return 5.0
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or not 0 <= v <= MAX_WAIT_S:
        from .escape import terminal

        raise GpuboxError(
            f"{WAIT_ENV}={terminal(raw[:40])} is not a number of seconds from 0 to {MAX_WAIT_S:g}",
            f"set {WAIT_ENV} to e.g. 30, or unset it for the default 5",
        )
    return v


def _holder_record(host, path: str) -> dict | None:
    """The holder record, read as what it is: a file someone else may have replaced. A regular file
    of at most RECORD_LIMIT bytes, or nothing (a FIFO, /dev/zero or a link there gives None at once,
    never a hang or a MemoryError)."""
    try:
        rec = json.loads(host.read_bounded(path, RECORD_LIMIT))
    except (OSError, ValueError, GpuboxError):
        return None
    return rec if isinstance(rec, dict) else None


def _lock_dir(host) -> None:
    """Make LOCK_DIR (no link followed: gpubox.safepath on a local host, `realpath -m` checked on
    others) and check it is gpubox's own: a directory, not a link, that nobody else may write.
    /run/lock is mode 1777 on Debian, so anyone may have made `gpubox` there first."""
    from .safepath import LINK_WHY, Refused

    try:
        st = host.stat(LOCK_DIR)
        if st is None:
            host.makedirs(LOCK_DIR, mode=0o700)
            st = host.stat(LOCK_DIR)
    except OSError as exc:
        raise os_error(exc) from None
    shown = f"{host.name}:{LOCK_DIR}"
    if st is None:
        raise Refused(shown, "could not be made")
    if stat.S_ISLNK(st.mode):
        raise Refused(shown, LINK_WHY)
    if not st.is_dir:
        raise Refused(shown, "is not a directory", "move it away: gpubox keeps its box locks there")
    mine = os.geteuid() if host.transport.is_local else 0
    if st.uid != mine or st.perms & 0o022:
        raise Refused(
            shown,
            f"belongs to uid {st.uid} with mode {st.perms:04o}: gpubox keeps its locks only in a "
            f"directory of its own (uid {mine}, writable by nobody else)",
            "remove it; gpubox makes it again (mode 0700)",
        )


def _lock_file(host, lock: str) -> None:
    """Make the lock file ourselves (an empty regular file) so that flock(1), which opens its
    argument following links and creating it, only ever opens a file gpubox made."""
    from .safepath import LINK_WHY, Refused

    try:
        st = host.stat(lock)
        if st is None:
            host.write(lock, b"", mode=0o600, backup=False)
            st = host.stat(lock)
    except OSError as exc:
        raise os_error(exc) from None
    if st is not None and stat.S_ISLNK(st.mode):
        raise Refused(f"{host.name}:{lock}", LINK_WHY)
    if st is None or not st.is_file:
        raise Refused(
            f"{host.name}:{lock}", "is not a regular file", "move it away: it is gpubox's lock file"
        )


def _alive_on(host, pid) -> bool:
    """Whether PID runs on HOST (its real /proc, not under the root prefix: a live process table)."""
    try:
        return isinstance(pid, int) and pid > 0 and host.transport.stat(f"/proc/{pid}") is not None
    except OSError:
        return False


def describe(rec: dict | None, live: bool) -> str:
    """`<command>` is already running (pid N on NODE since T), or who else it may be."""
    if not rec or not live:
        return "another process holds it (no live record: an older gpubox, or a scheduled run's flock)"
    from .escape import terminal

    what = " ".join(str(rec.get("what", "gpubox")).split())[:120]
    return terminal(
        f"`{what}` is already running (pid {rec.get('pid')} on {rec.get('node')} since {rec.get('since')})",
        limit=300,
    )


@contextmanager
def box_lock(ctx, what: str | None = None, wait: float | None = None, on: str = "host"):
    """Hold the lock of ctx.box on its Proxmox host for the duration of the block (WAIT seconds
    for a holder to finish: default $GPUBOX_LOCK_WAIT; 0 refuses at once). ON="container" takes
    the same-named lock inside the container instead (container-side work that cannot reach
    the host)."""
    box = ctx.box
    host = ctx.host if on == "host" else ctx.container
    lock, holder = lock_paths(box.vmid)
    real = host.path(lock)
    # A digest: the key travels in $GPUBOX_BOX_LOCK_HELD joined by os.pathsep, and paths hold ':'.
    key = hashlib.sha256(f"{box.id}\0{host.name}\0{real}".encode("utf-8", "surrogateescape")).hexdigest()[:32]
    with _mutex:
        reentered = bool(_held.get(key)) or key in os.environ.get(HELD_ENV, "").split(os.pathsep)
        if reentered:
            _held[key] = _held.get(key, 0) + 1
    if reentered:
        try:
            yield LockInfo(real, key)
        finally:
            with _mutex:
                _held[key] -= 1
        return
    wait = _wait_s() if wait is None else max(0.0, float(wait))
    _lock_dir(host)
    _lock_file(host, lock)
    argv = ["flock", *(["-n"] if wait == 0 else ["-w", f"{wait:g}"]), "-E", str(BUSY), real]
    held = host.transport.hold([*argv, "sh", "-c", _SCRIPT])
    line = held.first_line(timeout=wait + 30)
    if not line or not line.startswith("locked "):
        rc = held.wait(10)
        if rc is None:
            held.release(timeout=1)
        if rc == BUSY:
            rec = _holder_record(host, holder)
            who = describe(rec, _alive_on(host, (rec or {}).get("host_pid")))
            raise GpuboxError(
                f"{box.name} (CT {box.vmid} on {host.name}): {who}",
                f"wait for it to finish, or set {WAIT_ENV}=SECONDS to wait longer",
            )
        err = " ".join(held.stderr_text().split())[:200] or f"exit status {rc}"
        raise TransportError(
            f"cannot take the lock of {box.name} on {host.name} ({real}): {err}",
            "gpubox needs flock(1) (util-linux) on the Proxmox host and a writable /run/lock",
        )
    stale = _holder_record(host, holder)  # we hold the lock, so whoever wrote this is gone
    rec = {
        "box": box.id,
        "what": what or " ".join(["gpubox", *sys.argv[1:]])[:200],
        "pid": os.getpid(),
        "node": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host_pid": int(line.split()[1]) if line.split()[1:] and line.split()[1].isdigit() else None,
    }
    try:
        try:
            host.write(holder, json.dumps(rec) + "\n", mode=0o644, backup=False)
        except OSError as exc:
            raise os_error(exc) from None
        from .temps import CONTAINER_DIRS, HOST_DIRS, sweep

        swept = sweep(host, HOST_DIRS)  # a killed run's temps: removed before any work, and said
        ct = getattr(ctx, "container", None) if on == "host" else None
        if ct is not None and ct.transport.is_local:  # files here: no command per directory
            swept += [f"{ct.name}:{p}" for p in sweep(ct, CONTAINER_DIRS)]
        from .safeio import sweep_state

        swept += sweep_state()  # the control node's own: a killed run's temps in the state directory
        with _mutex:
            _held[key] = 1
        old_env = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = key if not old_env else old_env + os.pathsep + key
        try:
            yield LockInfo(real, key, stale, swept)
        finally:
            with _mutex:
                _held.pop(key, None)
            if old_env is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = old_env
            try:
                host.remove(holder)
            except OSError:
                pass
    finally:
        held.release()


def lock_for(ctx, mode: str):
    """The box lock when MODE changes the box, else a no-op context."""
    if mode != "apply" or getattr(ctx, "box", None) is None or not hasattr(ctx, "host"):
        return nullcontext()
    return box_lock(ctx)
