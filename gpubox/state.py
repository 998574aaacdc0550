"""The control node's state directory: backups, results, history, locks.

$GPUBOX_STATE_DIR, else $XDG_STATE_HOME/gpubox, else ~/.local/state/gpubox.

Names from the inventory (hosts, boxes) and remote paths become file names here only through
safe_name(): an inventory is user input, and `../../../../tmp/x` or a 300-character host name
must neither leave the state directory nor exceed NAME_MAX (255 bytes on Linux).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from .errors import os_error

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_NAME = 96  # well under NAME_MAX, leaving room for the suffixes we add (.lock, .<stamp>)


def safe_name(name: str, *, limit: int = MAX_NAME) -> str:
    """One path component for NAME: itself when plain and short (ct200, pve1.lan), else a readable
    slug plus a hash of the full name, so two different names never share a file and nothing can
    contain '/', '..', NUL or control characters."""
    name = str(name)
    if _PLAIN.match(name) and len(name) <= limit and name not in (".", ".."):
        return name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[: max(8, limit - 17)] or "x"
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{slug}-{digest}"


def state_root() -> Path:
    """The state directory's path (not created)."""
    env = os.environ.get("GPUBOX_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "gpubox"


def state_dir() -> Path:
    """The state directory, created private (0700: it holds backups of root's files) when new. It
    is the anchor of everything gpubox writes in it: beneath it no link is followed."""
    p = state_root()
    try:
        p.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise os_error(exc) from None
    return p


def sub_dir(*parts: str) -> Path:
    """<state dir>/<part>/... with every part made safe; created with mkdirat, one component at
    a time, no link followed (a planted `<state>/backups -> /etc` is refused, never written into)."""
    from .safepath import Anchor

    names = [safe_name(p) for p in parts]
    try:
        with Anchor(state_dir()) as anchor:
            os.close(anchor.makedirs("/".join(names), 0o755))
    except OSError as exc:
        raise os_error(exc) from None
    return state_dir().joinpath(*names)


def backup_path(host: str, path: str) -> Path:
    """Where a timestamped copy of `path` on `host` goes before gpubox overwrites it."""
    # One clock read for both parts: seconds from strftime and a separate read's microseconds could
    # order a later backup before an earlier one (the list numbers them by this stamp).
    us = time.time_ns() // 1000
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(us // 1_000_000)) + f"-{us % 1_000_000:06d}"
    flat = path.strip("/").replace("/", "__") or "root"
    return sub_dir("backups", host) / f"{safe_name(flat, limit=160)}.{stamp}"
