"""Page-cache helper for the cold-read staging tests: evict one directory's files, nothing global."""

from __future__ import annotations

import os
from pathlib import Path


def evict(d: Path) -> None:
    """Write back, then drop the cached pages of each file in `d` (posix_fadvise DONTNEED, per file)."""
    os.sync()
    for p in d.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
