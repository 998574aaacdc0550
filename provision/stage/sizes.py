"""The sizes every part of the copy agrees on, and how a size is shown.

A file is cut into CHUNK ranges (the unit of the schedule, the checksum tree and the journal); a
range is read, written and hashed BUF at a time; a cold range is read with O_DIRECT DIRECT_BLOCK
at a time. The modules read them as `sizes.CHUNK` (not a copy of the value), so a test or the
benchmark that sets one sets it for all."""

from __future__ import annotations

import os

CHUNK = 64 << 20
# read/hash/write slice: stays in L2 (2-core VM: 256 KiB <= 1 MiB < 4 MiB); the variable is for
# benchmarks/stage_vs_cp.py (BENCH_BUF_KIB) to time other sizes with the same engine
BUF = max(4, int(os.environ.get("GPUBOX_STAGE_BUF_KIB") or 1024)) << 10
# cold source: O_DIRECT reads of this size (the device writes into our buffer; the slices are then
# written and hashed BUF at a time)
DIRECT_BLOCK = max(BUF, int(os.environ.get("GPUBOX_STAGE_DIRECT_KIB") or 4096) << 10) // BUF * BUF
GB = 1e9


def nchunks(size: int) -> int:
    """How many CHUNK ranges a file of `size` bytes has (an empty file has one, empty)."""
    return max(1, -(-size // CHUNK))


def size_text(n: float) -> str:
    """A size for a person: GB from 0.1 GB up, MB below."""
    return f"{n / GB:.1f} GB" if abs(n) >= 0.1 * GB else f"{n / 1e6:.1f} MB"
