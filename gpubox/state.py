"""The control node's state directory: backups, results, history, locks.

$GPUBOX_STATE_DIR, else $XDG_STATE_HOME/gpubox, else ~/.local/state/gpubox.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def state_dir() -> Path:
    env = os.environ.get("GPUBOX_STATE_DIR")
    if env:
        p = Path(env)
    else:
        base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        p = Path(base) / "gpubox"
    p.mkdir(parents=True, exist_ok=True)
    return p


def backup_path(host: str, path: str) -> Path:
    """Where a timestamped copy of `path` on `host` goes before gpubox overwrites it."""
    stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 1_000_000:06d}"
    flat = path.strip("/").replace("/", "__") or "root"
    d = state_dir() / "backups" / host
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{flat}.{stamp}"
