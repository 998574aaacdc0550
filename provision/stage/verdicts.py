"""The cold probe's kept verdicts: which read path won on a source filesystem, kept on persistent
storage so the next cold run (the next reboot) probes nothing."""

from __future__ import annotations

import json
import os
import time

from .manifest import load_json

# how long a filesystem's read verdict is kept before the next cold run probes again
VERDICT_DAYS = float(os.environ.get("GPUBOX_STAGE_VERDICT_DAYS") or 7)
VERDICTS = "read-verdicts.json"


def _state_dir() -> str | None:
    """Where the read verdicts are kept: on persistent storage, never the tmpfs destination (a
    reboot empties it, and the reboot is when the verdict is wanted). GPUBOX_STAGE_STATE_DIR, else
    $XDG_STATE_HOME/gpubox or ~/.local/state/gpubox; GPUBOX_STAGE_STATE_DIR="" keeps none (every
    cold run probes)."""
    d = os.environ.get("GPUBOX_STAGE_STATE_DIR")
    if d is not None:
        return d or None
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpubox")


def fs_key(path: str, threads: int) -> str | None:
    """Which filesystem the source is on, and at what depth it was read: st_dev and the
    filesystem id (statfs f_fsid: ext4 and xfs derive it from the filesystem's UUID, so a disk
    that comes back under another device number, or another filesystem on the same number, is
    not mistaken for the one probed) and the thread count."""
    try:
        st, vfs = os.stat(path), os.statvfs(path)
    except OSError:
        return None
    return f"dev={st.st_dev:x} fsid={getattr(vfs, 'f_fsid', 0):x} threads={threads}"


def remembered(src: str, threads: int) -> dict | None:
    """The verdict of an earlier probe on this filesystem at this depth, younger than VERDICT_DAYS,
    or None (then the copy probes). Why keep it: the probe costs the copy the phases it spends
    with the slower path and waiting for each phase's slowest reader (~0.5 s of an 8 GB cold run
    on the 16-core device VM, benchmarks/results/stage.md), and a box's disk does not change between reboots;
    when it does (another disk, another filesystem) the key differs, and an old verdict expires."""
    d, key = _state_dir(), fs_key(src, threads)
    if d is None or key is None:
        return None
    doc = load_json(os.path.join(d, VERDICTS))
    e = doc.get(key) if isinstance(doc, dict) else None
    try:
        fresh = -300 <= time.time() - float(e["at"]) < VERDICT_DAYS * 86400  # (a clock set back a little)
        ok = e["mode"] in ("direct", "buffered") and isinstance(e["probe_gb_s"], dict)
    except (TypeError, KeyError, ValueError):
        return None
    return e if fresh and ok else None


def remember(src: str, threads: int, mode: str, rates: dict) -> None:
    """Keep this probe's verdict for the next cold run on this filesystem (atomic replace; where
    the state directory cannot be written nothing is kept and every cold run probes)."""
    d, key = _state_dir(), fs_key(src, threads)
    if d is None or key is None:
        return
    path = os.path.join(d, VERDICTS)
    try:
        os.makedirs(d, exist_ok=True)
        _drop_dead_temps(d)
        doc = load_json(path)
        doc = doc if isinstance(doc, dict) else {}
        doc[key] = {"mode": mode, "probe_gb_s": rates, "at": int(time.time())}
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def _drop_dead_temps(d: str) -> None:
    """Remove the VERDICTS.<pid>.tmp a killed run left in D (its pid no longer runs): the name is
    this process's own, so no later run would ever replace it. (The copier also runs as a payload
    script, without gpubox.safeio, whose clean_stale does this for gpubox's other files.)"""
    for name in os.listdir(d):
        pid = name[len(VERDICTS) + 1 : -len(".tmp")]
        if not (name.startswith(VERDICTS + ".") and name.endswith(".tmp") and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(d, name))
            except FileNotFoundError:
                pass
        except OSError:
            pass  # alive (EPERM: another user's): not ours to remove
