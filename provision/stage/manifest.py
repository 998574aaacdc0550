"""The destination's bookkeeping: the manifest, the journal, the partial files, and what an
interrupted run left that can be resumed.

Each file is written as NAME.partial and renamed when complete; a journal (.gpubox-journal.jsonl)
records every range written and every finished file, so a killed run resumes where it stopped,
inside a file too (its kept ranges are re-hashed in the partial first); the manifest
(.gpubox-manifest.json: size, mtime, hash and algo per file; the source's identity) is written
last, atomically, and the directory only counts as staged when it exists. Before changing a
staged directory the manifest is removed first (its entries move to the journal).
"""

from __future__ import annotations

import errno
import json
import os

from gpubox import safepath

from . import sizes
from .errors import StageError
from .hashing import LEGACY_ALGO

SCHEMA = "gpubox.stage/1"
MANIFEST = ".gpubox-manifest.json"
JOURNAL = ".gpubox-journal.jsonl"
PARTIAL = ".partial"


def temp_path(path: str) -> str:
    """Where a file is written before it is renamed into place (one name for every temp file here)."""
    return path + PARTIAL


READ_LIMIT = 256 << 20  # a manifest or journal of a model of many thousand files is a few MiB


def _read_bounded(path: str) -> bytes:
    """A manifest or journal: a regular file (not a link, FIFO or device: O_NOFOLLOW|O_NONBLOCK,
    then fstat) of at most READ_LIMIT bytes; anything else reads as absent."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return safepath.read_fd(fd, path, READ_LIMIT)
    except safepath.Refused:
        raise FileNotFoundError(path) from None
    finally:
        os.close(fd)


def load_json(path: str):
    """The JSON document at path, or None (missing, unreadable, not a regular file, too large, or
    cut short)."""
    try:
        return json.loads(_read_bounded(path))
    except (FileNotFoundError, ValueError, OSError, RecursionError):
        return None


def _journal_lines(dest: str):
    try:
        data = _read_bounded(os.path.join(dest, JOURNAL))
    except OSError:
        return
    for line in data.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line cut by the interruption
        if isinstance(e, dict) and isinstance(e.get("rel"), str):
            yield e


def load_journal(dest: str) -> dict[str, dict]:
    """Finished files recorded by an unfinished run: rel -> entry."""
    out: dict[str, dict] = {}
    for e in _journal_lines(dest):
        if "range" not in e and "hash" in e:
            e.setdefault("algo", LEGACY_ALGO)
            out[e["rel"]] = e
    return out


def _load_ranges(dest: str) -> dict[str, list[dict]]:
    """Ranges of unfinished files an interrupted run wrote into their NAME.partial: rel -> records
    ({range, digest, size, mtime_ns, algo}); a file finished later drops its ranges."""
    out: dict[str, list[dict]] = {}
    for e in _journal_lines(dest):
        if "range" in e:
            out.setdefault(e["rel"], []).append(e)
        else:
            out.pop(e["rel"], None)
    return out


def resumable(dest: str, todo: dict, src_files: dict[str, dict], algo: str) -> dict[str, list[dict]]:
    """The journaled ranges that can be resumed: the partial is still there and the source file has
    the size and mtime it had then, and this run hashes with the same algorithm."""
    out = {}
    for rel, recs in _load_ranges(dest).items():
        s = src_files.get(rel)
        if rel not in todo or s is None or not os.path.isfile(temp_path(os.path.join(dest, rel))):
            continue
        good = []
        for r in recs:
            try:
                ok = (r["size"], r["mtime_ns"], r["algo"]) == (s["size"], s["mtime_ns"], algo)
                ok = ok and 0 <= int(r["range"]) < sizes.nchunks(s["size"]) and bytes.fromhex(r["digest"])
            except (KeyError, TypeError, ValueError):
                ok = False
            if ok:
                good.append(r)
        if good:
            out[rel] = good
    return out


def dest_files(dest: str) -> set[str]:
    """The destination's files (rel paths), our hidden bookkeeping left out."""
    out = set()
    for dirpath, dirs, names in os.walk(dest):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if not n.startswith("."):
                out.add(os.path.relpath(os.path.join(dirpath, n), dest))
    return out


def partials(dest: str) -> list[str]:
    """The NAME.partial files under dest (rel paths)."""
    out = []
    for dirpath, _dirs, names in os.walk(dest):
        out += [os.path.relpath(os.path.join(dirpath, n), dest) for n in names if n.endswith(PARTIAL)]
    return out


def write_atomic(path: str, data: bytes, sync: bool) -> None:
    """path holds data, or (on any failure) what it held before: written beside it, then renamed."""
    tmp = temp_path(path)
    try:
        try:
            os.unlink(tmp)  # a leftover (or planted) temp: the name, never what it points to
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StageError(
                f"destination {os.path.dirname(path)} is full (writing "
                f"{os.path.basename(path)}: {exc.strerror})",
                "free space on the destination, then re-run to resume",
            ) from None
        raise
    os.replace(tmp, path)
