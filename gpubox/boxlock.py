"""One per-box lock for every command that changes a box (lxc fix, recover, tune, stage...).

Taken by the step engine itself (run_steps / run_pipeline in apply mode), so no command can
forget it. flock(2) on `<state dir>/locks/box-<name>.lock`: the kernel drops it when the holder
exits however it exits, so a crash leaves no stale lock. A second changer waits up to
$GPUBOX_LOCK_WAIT seconds (default 5) and then refuses with one line naming the holder (exit 2).
Re-entrant within a process (recover runs steps that run steps) and handed to child processes
through $GPUBOX_BOX_LOCK_HELD, as bench's run-once does for its health lock.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import GpuboxError, os_error
from .state import safe_name, sub_dir

HELD_ENV = "GPUBOX_BOX_LOCK_HELD"
WAIT_ENV = "GPUBOX_LOCK_WAIT"
_held: dict[str, int] = {}
_mutex = threading.Lock()


def lock_path(box: str) -> Path:
    return sub_dir("locks") / f"box-{safe_name(box)}.lock"


def _wait_s() -> float:
    try:
        return max(0.0, float(os.environ.get(WAIT_ENV, "5")))
    except ValueError:
        return 5.0


@contextmanager
def box_lock(box: str, what: str | None = None):
    """Hold BOX's change lock for the duration of the block."""
    try:
        path = lock_path(box)
    except OSError as exc:  # e.g. a file where the locks directory should be
        raise os_error(exc) from None
    key = str(path)
    with _mutex:
        if _held.get(key) or key in os.environ.get(HELD_ENV, "").split(os.pathsep):
            _held[key] = _held.get(key, 0) + 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield path
        finally:
            with _mutex:
                _held[key] -= 1
        return
    try:
        f = open(path, "a+")
    except OSError as exc:
        raise os_error(exc) from None
    try:
        deadline = time.monotonic() + _wait_s()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    f.seek(0)
                    holder = " ".join(f.read().split())[:200] or "another gpubox process"
                    raise GpuboxError(
                        f"{box} is being changed by {holder}",
                        f"wait for it to finish (or set {WAIT_ENV}=SECONDS to wait longer)",
                    ) from None
                time.sleep(0.1)
        what = what or " ".join(["gpubox", *sys.argv[1:]])[:120]
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} ({what}) since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
        f.flush()
        with _mutex:
            _held[key] = 1
        old_env = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = key if not old_env else old_env + os.pathsep + key
        try:
            yield path
        finally:
            with _mutex:
                _held.pop(key, None)
            if old_env is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = old_env
    finally:
        f.close()


def lock_for(ctx, mode: str):
    """The box lock when MODE changes the box, else a no-op context."""
    from contextlib import nullcontext

    box = getattr(getattr(ctx, "box", None), "name", None)
    if mode != "apply" or not box:
        return nullcontext()
    return box_lock(box)
