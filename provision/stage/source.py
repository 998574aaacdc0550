"""The source: its files (following links inside it and a Hugging Face snapshot's links into its
blobs, refusing links out of it unless asked), and its identity."""

from __future__ import annotations

import hashlib
import os
import stat

from .errors import StageError
from .manifest import PARTIAL

try:  # inside the gpubox package
    from .. import safetensors_check as stc
except ImportError:  # the package imported as a top-level `stage` (benchmarks/): it sits beside us
    import safetensors_check as stc  # type: ignore[no-redef]

HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--", "kernels--")


def _link_roots(src: str) -> list[str]:
    """Where links in src may point: src itself and, for a Hugging Face cache snapshot
    (CACHE/models--ORG--NAME/snapshots/REV), its repo directory (every file links to ../../blobs/)
    and the cache's shared Xet store CACHE/blobs/ (a repo's blobs/<etag> may link there; see
    tests/fixtures/stage/realworld/hf_cache_layouts.txt for the documented layouts)."""
    real = os.path.realpath(src)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots":
        repo = os.path.dirname(parent)
        roots.append(repo)
        if os.path.basename(repo).startswith(HF_REPO_PREFIXES):
            roots.append(os.path.join(os.path.dirname(repo), "blobs"))
    return roots


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def scan(src: str, *, follow_links: bool = False) -> dict[str, dict]:
    """rel path -> {size, mtime_ns, mode[, hub_sha256][, link]} of the regular files under src
    (hidden names skipped: .git, .cache, our own bookkeeping).

    Symlinks inside the source (and a Hugging Face snapshot's links into its blobs/) are followed.
    A link out of the source is refused unless follow_links: a file linked in from elsewhere would
    be copied without anyone having chosen it (then it is followed and named: entry["link"]).
    A directory link back up the tree is refused (a loop)."""
    if not os.path.isdir(src):
        raise StageError(f"source {src} is not a directory", "give the persistent model directory")
    roots = _link_roots(src)
    out: dict[str, dict] = {}
    outside: list[tuple[str, str]] = []
    seen_dirs: set[tuple[int, int]] = set()
    for dirpath, dirs, names in os.walk(src, followlinks=True):
        dst = os.stat(dirpath)
        if (dst.st_dev, dst.st_ino) in seen_dirs:
            raise StageError(
                f"source directory {dirpath} is reached twice through links (a loop, or a "
                f"second link to one directory)",
                "remove the extra directory link from the source",
            )
        seen_dirs.add((dst.st_dev, dst.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in names:
            if n.startswith(".") or n.endswith(PARTIAL):
                continue
            p = os.path.join(dirpath, n)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                raise StageError(f"source file {p} is a broken link", "repair the source directory") from None
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(p, src)
            e = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "mode": stat.S_IMODE(st.st_mode) & 0o777}
            real = os.path.realpath(p)
            if not _inside(real, roots):
                outside.append((rel, real))
                e["link"] = real
            hub = stc.hub_sha256(p)
            if hub:
                e["hub_sha256"] = hub
            out[rel] = e
    if outside and not follow_links:
        rel, real = outside[0]
        raise StageError(
            f"{len(outside)} file(s) in {src} are links out of it, e.g. {rel} -> {real}",
            "copy them into the source, or pass --follow-links to stage what they point at",
        )
    if not out:
        raise StageError(
            f"source {src} has no files", "point at the directory that holds config.json and the shards"
        )
    return out


def fingerprint(files: dict[str, dict]) -> str:
    """Identity of a source: sha256 over (name, size, mtime) of every file."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel]['size']}\0{files[rel]['mtime_ns']}\n".encode())
    return h.hexdigest()
