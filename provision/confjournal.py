"""Which `<vmid>.conf.tmp.<pid>` files in /etc/pve are gpubox's: a journal on the control node.

The config is written Proxmox's way, `<file>.tmp.<pid>` then rename() (pve-common File.pm
file_set_contents), so a temp a killed gpubox left has the same shape as one a Proxmox task is
writing right now. Before it creates its temp, the writer records (host, root, temp, its own pid)
here; the entry goes once the temp is renamed or removed. A run killed in between (SIGKILL at any
commit point) leaves the entry, and the next write to that host removes exactly the temps whose
recorded writer is no longer alive on the control node: never a temp it did not write, never
one a live run is writing.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

from gpubox.safeio import pid_alive


def _file(host) -> Path:
    from gpubox.state import sub_dir

    tag = hashlib.sha1(f"{host.name}\0{host.root}".encode()).hexdigest()[:16]
    return sub_dir("conf-temps") / f"{tag}.json"


def _load(p: Path) -> list[dict]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def _save(p: Path, entries: list[dict]) -> None:
    from gpubox.safeio import write_atomic

    write_atomic(p, (json.dumps(entries) + "\n").encode(), mode=0o600)


@contextmanager
def writing(host, vmid: int, tmp: str):
    """Record TMP (a real path on HOST) as this process's while the block runs."""
    p = _file(host)
    entry = {"vmid": int(vmid), "tmp": tmp, "pid": os.getpid()}
    _save(p, [*_load(p), entry])
    try:
        yield
    finally:
        _save(p, [e for e in _load(p) if e != entry])


def sweep(host, vmid: int | None = None) -> list[str]:
    """Remove the temps that killed gpubox runs left on HOST (of VMID, or all); the real paths
    removed. An entry whose writer still runs is left alone."""
    p = _file(host)
    entries = _load(p)
    keep, removed = [], []
    for e in entries:
        pid, tmp = e.get("pid"), e.get("tmp")
        if (
            not isinstance(pid, int)
            or not isinstance(tmp, str)
            or pid_alive(pid)
            or (vmid is not None and e.get("vmid") != vmid)
        ):
            keep.append(e)
            continue
        if not os.path.basename(tmp).endswith(f".tmp.{pid}"):
            continue  # not a name this writer makes: never removed on the journal's word
        try:
            if host.transport.stat(tmp) is not None:
                host.transport.remove(tmp)
                removed.append(tmp)
        except OSError:
            keep.append(e)  # the filesystem refused (no quorum): try again next time
    if keep != entries:
        _save(p, keep)
    return removed
