"""The two operations: check (is DEST a complete, current copy of SRC? reads only) and stage (make
it one), each pass of stage its own function saying why (stage()'s docstring lists them)."""

from __future__ import annotations

import datetime
import json
import os
import stat
import time

from gpubox import safepath
from gpubox.safepath import canonical

from . import sizes
from .copier import Copier
from .destination import decide
from .errors import StageError
from .hashing import algorithm
from .lock import Lock
from .manifest import (
    JOURNAL,
    MANIFEST,
    PARTIAL,
    SCHEMA,
    dest_files,
    partials,
    resumable,
    temp_path,
    write_atomic,
)
from .room import FS_MARGIN, MEM_MARGIN, check_room, existing, fstype
from .source import scan
from .threads import default_workers

try:  # inside the gpubox package
    from .. import safetensors_check as stc
except ImportError:  # the package imported as a top-level `stage` (benchmarks/): it sits beside us
    import safetensors_check as stc  # type: ignore[no-redef]


def check(
    src: str,
    dest: str,
    *,
    verify: bool = False,
    require_tokenizer: bool = True,
    workers: int | None = None,
    follow_links: bool = False,
) -> dict:
    """Is dest a complete, current copy of src? Reads only (stat, headers; hashes with verify)."""
    t0 = time.monotonic()
    files = scan(src, follow_links=follow_links)
    a = decide(files, dest, verify=verify, workers=workers)
    problems = []
    if not a["manifest"]:
        problems.append(
            "manifest absent: not staged"
            if not a["known"]
            else f"manifest absent: staging was interrupted ({len(a['known'])} of {len(files)} files done)"
        )
    elif a["source_changed"]:
        problems.append("the source changed since it was staged")
    for rel, why in sorted(a["todo"].items()):
        if a["manifest"] or why != "not staged":
            problems.append(f"{rel}: {why}")
    if a["stale"]:
        problems.append(f"{len(a['stale'])} staged file(s) no longer in the source, e.g. {a['stale'][0]}")
    for rel, mode in sorted(a["modes"].items()):
        problems.append(f"{rel}: mode {mode:04o} in the destination, {files[rel]['mode']:04o} in the source")
    if os.path.isdir(dest):
        present = {r: None for r in dest_files(dest)}
        if a["manifest"] or present:
            problems += [f"integrity: {p}" for p in stc.check_model(dest, present, require_tokenizer)]
    return {
        "schema": SCHEMA,
        "op": "check",
        "src": src,
        "dest": dest,
        "staged": not problems,
        "problems": problems,
        "files": len(files),
        "bytes": sum(f["size"] for f in files.values()),
        "todo": len(a["todo"]),
        "todo_bytes": sum(files[r]["size"] for r in a["todo"]),
        "verified": a["verified"],
        "mismatched": a["mismatched"],
        "source_changed": a["source_changed"],
        "hashes": a["hashes"],
        "seconds": round(time.monotonic() - t0, 4),
    }


def stage(
    src: str,
    dest: str,
    *,
    verify: bool = False,
    force: bool = False,
    dry_run: bool = False,
    workers: int | None = None,
    require_tokenizer: bool = True,
    cgroup_dir: str | None = None,
    tmpfs: bool | None = None,
    free_space=None,
    margin: int = FS_MARGIN,
    mem_margin: int = MEM_MARGIN,
    progress=None,
    on_file=None,
    source_info: dict | None = None,
    hash: str | None = None,
    follow_links: bool = False,
) -> dict:
    """Make dest a verified copy of src. Returns the summary (bytes, seconds, GB/s, files copied,
    skipped, verified). `hash` (xxh3 | crc32 | sha256, default xxh3, crc32 without xxhash) hashes
    the files this run copies; files kept from an earlier run keep theirs. `progress` has
    start(total, description)/advance(n)/stop(); `on_file(rel)` is called after each file lands
    (tests use it to interrupt a run). Staged files get the source file's permission bits; links
    out of the source are refused unless follow_links (then listed in "links_out").

    The passes, in order (each its own function, saying why): _source (what to copy, and is it a
    model), _dry_run (or: what would happen, nothing changed), under the lock _plan (what the
    destination holds, what an interrupted run left to resume), _fix_modes, the room check
    (_room_needed, check_room), _unpublish (the directory stops looking staged), _copy_pass,
    _publish (the manifest, last)."""
    t0 = time.monotonic()
    algo = algorithm(hash)
    workers = workers or default_workers()
    src, dest = canonical(os.path.abspath(src)), canonical(os.path.abspath(dest))
    files = _source(src, dest, follow_links=follow_links, require_tokenizer=require_tokenizer, force=force)
    if tmpfs is None:
        tmpfs = fstype(existing(dest)) == "tmpfs"
    summary = _new_summary(src, dest, files, algo, dry_run)
    room_kw = {
        "tmpfs": tmpfs,
        "cgroup_dir": cgroup_dir,
        "free_space": free_space,
        "margin": margin,
        "mem_margin": mem_margin,
    }
    if dry_run:
        return _finished(summary, t0, **_dry_run(files, dest, verify, workers, room_kw))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with Lock(dest):
        a, ranges = _plan(files, dest, verify=verify, workers=workers, algo=algo)
        summary.update(verified=a["verified"], reasons=a["todo"], source_changed=a["source_changed"])
        summary["modes_fixed"] = _fix_modes(dest, files, a["modes"])
        if a["manifest"] and not a["todo"] and not a["stale"] and not a["source_changed"]:
            return _finished(summary, t0, skipped=len(a["keep"]))
        need = _room_needed(files, dest, a["todo"], ranges)
        room = {} if force else check_room(dest, need, **room_kw)
        sync = not tmpfs  # fsync buys nothing on tmpfs (a reboot empties it anyway)
        kept = _unpublish(dest, a, ranges, sync)
        copier = _copy_pass(src, dest, files, a["todo"], ranges, need, workers, sync, algo, progress, on_file)
        summary.update(
            read_direct_bytes=copier.direct_bytes, resumed_bytes=copier.resumed_bytes, read=copier.read
        )
        _publish(
            src,
            dest,
            files,
            a["fingerprint"],
            {**kept, **copier.done},
            algo=algo,
            sync=sync,
            require_tokenizer=require_tokenizer,
            force=force,
            source_info=source_info,
        )
        return _finished(
            summary,
            t0,
            copied=len(copier.done),
            copied_bytes=sum(e["size"] for e in copier.done.values()),
            skipped=len(a["keep"]),
            removed=a["stale"],
            room=room,
        )


def _source(src: str, dest: str, *, follow_links: bool, require_tokenizer: bool, force: bool) -> dict:
    """The source's files (scan), refused before anything is written when it overlaps the
    destination (a copy into itself would never end) or is not a complete model (an incomplete
    copy would be staged and served; --force copies it as it is)."""
    # judged on the resolved paths too: a destination that reaches into the source through a link
    # (or the source into the destination) would write into the persistent source
    for s, d in ((src, dest), (os.path.realpath(src), os.path.realpath(dest))):
        if d == s or d.startswith(s.rstrip("/") + "/") or s.startswith(d.rstrip("/") + "/"):
            raise StageError(
                f"source {src} and destination {dest} overlap", "stage into a separate directory"
            )
    own_destination(dest)
    files = scan(src, follow_links=follow_links)
    src_problems = stc.check_model(src, files, require_tokenizer)
    if src_problems and not force:
        raise StageError(
            f"source {src} is not a complete model: {'; '.join(src_problems[:3])}",
            "repair the source (or pass --force to copy it as it is)",
        )
    return files


def _new_summary(src: str, dest: str, files: dict, algo: str, dry_run: bool) -> dict:
    """The summary every outcome returns, with its keys present from the start (a no-op run, a dry
    run and a copy answer in one shape for --json and the step's evidence)."""
    return {
        "schema": SCHEMA,
        "op": "stage",
        "src": src,
        "dest": dest,
        "dry_run": dry_run,
        "hash": algo,
        "files": len(files),
        "bytes": sum(f["size"] for f in files.values()),
        "copied": 0,
        "copied_bytes": 0,
        "skipped": 0,
        "verified": 0,
        "removed": [],
        "reasons": {},
        "source_changed": False,
        "modes_fixed": [],
        "read_direct_bytes": 0,
        "resumed_bytes": 0,
        "links_out": {r: e["link"] for r, e in sorted(files.items()) if "link" in e},
    }


def _finished(summary: dict, t0: float, **kw) -> dict:
    summary.update(kw)
    secs = time.monotonic() - t0
    summary["seconds"] = round(secs, 4)
    summary["gb_s"] = round(summary["copied_bytes"] / secs / sizes.GB, 3) if secs > 0 else 0.0
    return summary


def _dry_run(files: dict, dest: str, verify: bool, workers: int, room_kw: dict) -> dict:
    """What a run would do, without the lock and without writing: the files to copy and why, and
    whether the room check would refuse (reported, not raised: a dry run shows what apply meets)."""
    a = decide(files, dest, verify=verify, workers=workers)
    todo = a["todo"]
    need = sum(files[r]["size"] for r in todo)
    try:
        room, room_problem = check_room(dest, need, **room_kw), None
    except StageError as exc:
        room, room_problem = {}, exc.problem
    return {
        "would_copy": sorted(todo),
        "would_copy_bytes": need,
        "reasons": todo,
        "skipped": len(a["keep"]),
        "would_chmod": sorted(a["modes"]),
        "verified": a["verified"],
        "removed": a["stale"],
        "source_changed": a["source_changed"],
        "manifest": a["manifest"],
        "room": room,
        "room_problem": room_problem,
    }


def _plan(files: dict, dest: str, *, verify: bool, workers: int, algo: str) -> tuple[dict, dict]:
    """What the destination holds (decide) and which ranges of an interrupted run's partials can be
    resumed (each is re-hashed before it is kept). Under the lock, so no other stager changes it
    between this and the copy. Every other leftover partial is removed here: it is nobody's work
    any more and holds tmpfs memory."""
    a = decide(files, dest, verify=verify, workers=workers)
    ranges = resumable(dest, a["todo"], files, algo)
    for rel in partials(dest):
        if rel[: -len(PARTIAL)] not in ranges:
            os.unlink(os.path.join(dest, rel))
    return a, ranges


def own_destination(dest: str) -> None:
    """The destination is a directory of gpubox's own, or absent: not a link, not someone else's,
    writable by nobody else (a directory in /dev/shm that another user made first, or /dev/shm
    itself, is refused before anything is written)."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise StageError(f"destination {dest} {safepath.LINK_WHY}", "give the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise StageError(
            f"destination {dest} is not a directory", "move it away, or choose another destination"
        )
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise StageError(
            f"destination {dest} is not a directory of gpubox's own (uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o})",
            "stage into a directory of its own, e.g. /dev/shm/<model>",
        )


def _fix_modes(dest: str, files: dict, modes: dict) -> list[str]:
    """Permissions follow the source: a kept file whose mode was changed is set back in place (an
    fchmod on the file opened with no link followed beneath the destination, no copy). Returns the
    files fixed (the summary's modes_fixed)."""
    if not modes:
        return []
    with safepath.Anchor(dest) as anchor:
        for rel in sorted(modes):
            fd = anchor.open(rel, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fchmod(fd, files[rel]["mode"])
            finally:
                os.close(fd)
    return sorted(modes)


def _room_needed(files: dict, dest: str, todo: dict, ranges: dict) -> int:
    """Bytes the copy adds to the destination: what a kept partial already holds is there."""
    need = sum(files[r]["size"] for r in todo)
    for rel in ranges:
        need -= min(files[rel]["size"], os.stat(temp_path(os.path.join(dest, rel))).st_blocks * 512)
    return max(0, need)


def _unpublish(dest: str, a: dict, ranges: dict, sync: bool) -> dict:
    """From here the directory must not look complete: the journal is rewritten with the kept
    files' entries and the resumable ranges (so an interruption from now on resumes instead of
    starting over), then the manifest goes, then files removed from the source. Returns the kept
    entries (rel -> manifest entry)."""
    os.makedirs(dest, exist_ok=True)
    kept = {r: a["known"][r] for r in a["keep"]}
    write_atomic(
        os.path.join(dest, JOURNAL),
        b"".join((json.dumps({**e, "rel": r}) + "\n").encode() for r, e in kept.items())
        + b"".join((json.dumps(e) + "\n").encode() for recs in ranges.values() for e in recs),
        sync,
    )
    try:
        os.unlink(os.path.join(dest, MANIFEST))
    except FileNotFoundError:
        pass
    for rel in a["stale"]:
        os.unlink(os.path.join(dest, rel))
    return kept


def _copy_pass(src, dest, files, todo, ranges, need, workers, sync, algo, progress, on_file) -> Copier:
    """Copy the files to copy (Copier: ranges across threads, the cold probe, checksums, the
    journal), with the progress bar around it stopped whatever happens. Returns the Copier (its
    `done` entries and read figures)."""
    started = progress is not None and need > 0
    if started:
        progress.start(need, f"staging {os.path.basename(dest)}")
    try:
        copier = Copier(
            src,
            dest,
            {r: files[r] for r in todo},
            workers=workers,
            sync=sync,
            algo=algo,
            advance=progress.advance if started else None,
            on_file=on_file,
            resume={
                r: {int(e["range"]): bytes.fromhex(e["digest"]) for e in recs} for r, recs in ranges.items()
            },
        )
        copier.run()
    finally:
        if started:
            progress.stop()
    return copier


def _publish(
    src: str,
    dest: str,
    files: dict,
    fp: str,
    entries: dict,
    *,
    algo: str,
    sync: bool,
    require_tokenizer: bool,
    force: bool,
    source_info: dict | None,
) -> None:
    """The copy's own integrity check, then the manifest, written last and atomically: only now does
    the directory count as staged. The journal is not needed any more once the manifest holds
    every entry."""
    problems = stc.check_model(dest, {r: None for r in entries}, require_tokenizer)
    if problems and not force:
        raise StageError(
            f"staged copy {dest} fails its integrity check: {problems[0]}",
            "check the source, then re-run",
        )
    manifest = {
        "schema": SCHEMA,
        "hash": algo,
        "chunk": sizes.CHUNK,  # per file: "algo" (kept files keep theirs)
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": {
            "path": (source_info or {}).get("path", src),
            "fingerprint": fp,
            "files": len(files),
            "bytes": sum(f["size"] for f in files.values()),
            **{k: v for k, v in (source_info or {}).items() if k != "path"},
        },
        "files": {r: {k: v for k, v in entries[r].items() if k != "rel"} for r in sorted(entries)},
    }
    write_atomic(os.path.join(dest, MANIFEST), json.dumps(manifest, indent=1).encode(), sync)
    os.unlink(os.path.join(dest, JOURNAL))
