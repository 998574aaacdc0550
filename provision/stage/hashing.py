"""The checksums: which algorithms, the digest of a range copied on the way, a file's digest as a
tree of its range digests, and hashing files already on disk in parallel (--verify).

Which checksum, and why XXH3 by default:
- The threat is accidental: a copy from trusted local storage that was cut short, truncated, or
  had bits flipped (a bad disk/NFS read, a crash mid-copy), not an adversary who forges content.
  Storage systems check exactly this with fast non-cryptographic checksums: ZFS's default
  checksum is fletcher4, GCS and S3 use CRC32C per object/part. So the default is XXH3-64 per
  64 MiB range ("xxh3-tree-64MiB", python-xxhash, a dependency): measured from 1 MiB buffers, one
  thread, best of 7 on the loaded 2-core dev machine: xxh3 25.8 GB/s, crc32c (crc32c package) 6.3,
  BLAKE3 1.4, zlib.crc32 1.3, sha256 (SHA-NI) 0.4; all of them release the GIL. At that rate the
  checksum is ~2% of a copy's CPU; crc32 was ~25%, sha256 ~45%. google-crc32c was not taken: it
  refuses a writable buffer (our reads land in one), so it would need a copy.
- Where xxhash is missing (the standalone payload in a bare container) the default is zlib.crc32
  ("crc32-tree-64MiB"); `hash="sha256"` ("sha256-tree-64MiB") stays for who wants a cryptographic
  digest of the staged copy.
- A Hugging Face cache source is still checked against the hub's sha256 (the LFS blob name)
  whatever the chunk hash: that sequential whole-file sha256 is the hub's own identity check.
- Every file entry records its algorithm ("algo"); --verify, resume/skip and check use the entry's
  own algorithm, so a directory staged with sha256 stays staged (and verifiable) when xxh3 is the
  request, and vice versa. Only changed files are re-copied (with the requested algorithm). An entry
  whose algorithm cannot be computed here (xxh3 without xxhash) passes the cheap check, and --verify
  re-copies it with one that can.

A file's digest is sha256 over its range digests (xxh3: 8 bytes big-endian each, crc32: 4), so
ranges of one big shard hash in parallel and in any order; a whole-file hash is a sequential chain
and would leave one core busy with the largest shard at the end. The range digests are kept
(manifest "ranges"), so --verify names the damaged byte ranges.
"""

from __future__ import annotations

import hashlib
import os
import zlib

from . import sizes
from .errors import StageError
from .readers import NO_LOCK, copy_span, map_span, open_src
from .threads import default_workers, run_tasks

try:  # python-xxhash (pyproject dependency); the standalone payload may run where it is missing
    import xxhash
except ImportError:  # then crc32 (zlib) is the default and xxh3 entries cannot be re-hashed here
    xxhash = None  # type: ignore[assignment]
# --hash NAME -> algorithm (the name the manifest records)
HASHES = {"xxh3": "xxh3-tree-64MiB", "crc32": "crc32-tree-64MiB", "sha256": "sha256-tree-64MiB"}
DEFAULT_HASH = "xxh3" if xxhash is not None else "crc32"
HASH_ALGO = HASHES[DEFAULT_HASH]
LEGACY_ALGO = HASHES["sha256"]  # entries written before the choice existed carry no "algo"


class _Crc32:
    """zlib.crc32 with hashlib's update/digest (zlib releases the GIL for buffers > 5 KiB)."""

    __slots__ = ("crc",)

    def __init__(self):
        self.crc = 0

    def update(self, data) -> None:
        self.crc = zlib.crc32(data, self.crc)

    def digest(self) -> bytes:
        return self.crc.to_bytes(4, "big")


CHUNK_HASH = {HASHES["crc32"]: _Crc32, HASHES["sha256"]: hashlib.sha256}
if xxhash is not None:  # XXH3 64-bit; digest() is the canonical 8 bytes, big-endian
    CHUNK_HASH[HASHES["xxh3"]] = xxhash.xxh3_64


def algorithm(name: str | None) -> str:
    """The algorithm for a --hash NAME (xxh3, crc32, sha256; or the full name); None: the default."""
    if name is None:
        return HASH_ALGO
    algo = HASHES.get(name, name)
    if algo in CHUNK_HASH:
        return algo
    if algo in HASHES.values():
        raise StageError(
            f"hash {name!r} needs the Python package xxhash, which is not installed here",
            "pip install xxhash, or use --hash crc32",
        )
    raise StageError(f"unknown hash {name!r}", f"use one of: {', '.join(HASHES)}")


def chunk(
    sfd: int,
    dfd: int | None,
    start: int,
    end: int,
    algo: str = HASH_ALGO,
    extra=None,
    advance=None,
    block: int = sizes.BUF,
    prefetch: int = 0,
    h=None,
    wlock=NO_LOCK,
    view=None,
) -> bytes:
    """The `algo` digest of [start, end) of sfd, copied to dfd on the way (readers.copy_span). `h`:
    a hash that already holds the range's first bytes (the cold probe copied them), continued from
    start. `view`: the destination's shared mapping (readers.map_span writes there, not pwrite to dfd)."""
    if h is None:
        h = CHUNK_HASH[algo]()
    if view is not None:
        map_span(h, sfd, view, start, end, extra, advance, block)  # cached: no prefetch
    else:
        copy_span(h, sfd, dfd, start, end, extra, advance, block, prefetch, wlock)
    return h.digest()


def tree(digests: list[bytes]) -> str:
    """A file's digest: sha256 over its range digests, in order."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


def bad_ranges(parts: list[bytes], ranges, size: int) -> str:
    """ ": bytes A-B[, ...]" for the 64 MiB ranges whose digest differs from the recorded one."""
    if not isinstance(ranges, list) or len(ranges) != len(parts):
        return ""
    bad = [i for i, (p, r) in enumerate(zip(parts, ranges)) if p.hex() != r]
    spans = ", ".join(f"{i * sizes.CHUNK}-{min(size, (i + 1) * sizes.CHUNK) - 1}" for i in bad[:3])
    return f": bytes {spans}{' ...' if len(bad) > 3 else ''}" if bad else ""


def chunk_digests(
    root: str, lengths: dict[str, int], *, algo: str = HASH_ALGO, workers: int | None = None, advance=None
) -> dict[str, list[bytes]]:
    """`algo` digest of every 64 MiB range of each file (rel -> [digest per range]), in parallel."""
    parts: dict[str, list] = {r: [None] * sizes.nchunks(s) for r, s in lengths.items()}
    step = sizes.CHUNK

    def task(rel, i):
        def run():
            fd = open_src(os.path.join(root, rel))
            try:
                parts[rel][i] = chunk(
                    fd, None, i * step, min(lengths[rel], (i + 1) * step), algo, advance=advance
                )
            except StageError as exc:
                raise StageError(
                    f"{os.path.join(root, rel)} shrank while it was hashed ({exc.problem})",
                    "re-run when nothing else writes to it",
                ) from None
            finally:
                os.close(fd)

        return run

    order = sorted(lengths, key=lambda r: -lengths[r])
    run_tasks(
        [task(r, i) for r in order for i in range(sizes.nchunks(lengths[r]))], workers or default_workers()
    )
    return parts


def hash_files(
    root: str, lengths: dict[str, int], *, algo: str = HASH_ALGO, workers: int | None = None, advance=None
) -> dict[str, str]:
    """`algo` digest of each file (rel -> hex): sha256 over its range digests."""
    parts = chunk_digests(root, lengths, algo=algo, workers=workers, advance=advance)
    return {r: tree(p) for r, p in parts.items()}
