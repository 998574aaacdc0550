"""What the destination holds against the source: staged and current, to (re)copy and why, ours
but gone from the source, someone else's, and (with verify) re-hashed."""

from __future__ import annotations

import os
import stat

from .hashing import CHUNK_HASH, LEGACY_ALGO, bad_ranges, chunk_digests, tree
from .manifest import MANIFEST, PARTIAL, SCHEMA, dest_files, load_journal, load_json
from .source import fingerprint


def decide(
    src_files: dict[str, dict], dest: str, *, verify: bool = False, workers: int | None = None
) -> dict:
    """Compare the destination with the source: what is staged, what must be (re)copied and why."""
    manifest = load_json(os.path.join(dest, MANIFEST))
    if manifest is not None and manifest.get("schema") != SCHEMA:
        manifest = None
    legacy = (manifest or {}).get("hash") or LEGACY_ALGO
    known: dict[str, dict] = {r: {"algo": legacy, **e} for r, e in (manifest or {}).get("files", {}).items()}
    known.update(load_journal(dest))
    todo: dict[str, str] = {}
    keep: list[str] = []
    modes: dict[str, int] = {}  # kept files whose permissions differ from the source's
    for rel, s in src_files.items():
        e = known.get(rel)
        try:
            dst = os.stat(os.path.join(dest, rel))
        except (FileNotFoundError, NotADirectoryError):
            dst = None
        if e is None:
            todo[rel] = "not staged"
        elif e.get("size") != s["size"] or e.get("mtime_ns") != s["mtime_ns"]:
            todo[rel] = "changed in the source"
        elif dst is None:
            todo[rel] = "missing in the destination"
        elif dst.st_size != e["size"]:
            todo[rel] = f"size {dst.st_size} in the destination, {e['size']} staged"
        elif dst.st_mtime_ns != e["mtime_ns"]:
            todo[rel] = "modified in the destination"
        else:
            keep.append(rel)
            if "mode" in s and stat.S_IMODE(dst.st_mode) != s["mode"]:
                modes[rel] = stat.S_IMODE(dst.st_mode)
    verified, mismatched = 0, []
    if verify and keep:
        # each file with the algorithm it was staged with (a sha256 manifest stays verifiable)
        by_algo: dict[str, list[str]] = {}
        for rel in keep:
            by_algo.setdefault(known[rel]["algo"], []).append(rel)
        for algo, rels in sorted(by_algo.items()):
            if algo not in CHUNK_HASH:
                for rel in rels:
                    todo[rel] = f"staged with hash {algo!r}, which this copier cannot compute here"
                continue
            parts = chunk_digests(dest, {r: src_files[r]["size"] for r in rels}, algo=algo, workers=workers)
            for rel in rels:
                if tree(parts[rel]) != known[rel].get("hash"):
                    todo[rel] = "hash mismatch (corrupted in the destination)" + bad_ranges(
                        parts[rel], known[rel].get("ranges"), src_files[rel]["size"]
                    )
                    mismatched.append(rel)
                else:
                    verified += 1
        keep = [r for r in keep if r not in todo]
    present = dest_files(dest) if os.path.isdir(dest) else set()
    stale = sorted(r for r in present - set(src_files) if r in known)  # ours, gone from the source
    extra = sorted(r for r in present - set(src_files) - set(known) if not r.endswith(PARTIAL))
    fp = fingerprint(src_files)
    src_changed = bool(manifest) and manifest.get("source", {}).get("fingerprint") != fp
    return {
        "manifest": manifest is not None,
        "todo": todo,
        "keep": keep,
        "stale": stale,
        "extra": extra,
        "verified": verified,
        "mismatched": sorted(mismatched),
        "hashes": sorted({known[r]["algo"] for r in keep}),
        "modes": {r: m for r, m in modes.items() if r in keep},
        "source_changed": src_changed,
        "fingerprint": fp,
        "known": known,
    }
