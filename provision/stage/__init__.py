"""Stage a model directory into tmpfs (/dev/shm): fast, hash-verified, atomic, resumable.

Stdlib only (rich and xxhash are optional and imported where present) so the same code can run
inside a container that has no gpubox: as a payload (gpubox.transport.payload ships this package
and safetensors_check, zipped, and runs `__main__` with the container's python3). With a local
transport gpubox calls `run_request()` in-process on paths under the container's root prefix.

One idea per module, from the bottom up (docs/stage.md says what the feature does and why):
- sizes: the range, slice and O_DIRECT sizes every part agrees on; errors: StageError;
  threads: how many copy threads and how a batch runs on them;
- readers: buffered and O_DIRECT reads of the source, page-cache residency, the span copy;
- hashing: the checksums (why XXH3 by default), a file's digest tree, hashing files in place;
- manifest: the manifest, the journal and the partials (resume); source: the source's files and
  identity; destination: what the destination holds against the source (decide);
- schedule: the work-stealing schedule of ranges; verdicts: the cold probe's kept verdicts;
  probe: how a run reads its source (cold share, the probe, thread count);
- copier: the Copier; room: space and memory checks; lock: one stager at a time;
- operations: check and stage; progress: the bars; request: one operation as data and the
  command line; __main__: the entry the payload runs.

An flock on .NAME.gpubox-stage.lock beside the destination keeps a second stager out.
"""

from .copier import Copier
from .destination import decide
from .errors import StageError
from .hashing import DEFAULT_HASH, HASH_ALGO, HASHES, LEGACY_ALGO, algorithm, chunk_digests, hash_files
from .lock import LOCK, Lock
from .manifest import JOURNAL, MANIFEST, PARTIAL, SCHEMA, temp_path
from .operations import check, stage
from .probe import COLD_THREADS, DIRECT_MARGIN, PROBE_BYTES, PROBE_PHASES, WRITERS_PER_FILE
from .progress import LineProgress, RichProgress, rich_progress
from .readers import DIRECT_FS, PREFETCH, cached_bytes
from .request import main, run_request
from .room import FS_MARGIN, MEM_MARGIN, cgroup_memory, check_room, statvfs_free
from .schedule import WRITE_LOCK
from .sizes import BUF, CHUNK, DIRECT_BLOCK, GB, size_text
from .source import HF_REPO_PREFIXES, fingerprint, scan
from .threads import cpu_count, default_workers
from .verdicts import VERDICT_DAYS, VERDICTS

__all__ = [
    "BUF",
    "CHUNK",
    "COLD_THREADS",
    "DEFAULT_HASH",
    "DIRECT_BLOCK",
    "DIRECT_FS",
    "DIRECT_MARGIN",
    "FS_MARGIN",
    "GB",
    "HASHES",
    "HASH_ALGO",
    "HF_REPO_PREFIXES",
    "JOURNAL",
    "LEGACY_ALGO",
    "LOCK",
    "MANIFEST",
    "MEM_MARGIN",
    "PARTIAL",
    "PREFETCH",
    "PROBE_BYTES",
    "PROBE_PHASES",
    "SCHEMA",
    "VERDICTS",
    "VERDICT_DAYS",
    "WRITERS_PER_FILE",
    "WRITE_LOCK",
    "Copier",
    "LineProgress",
    "Lock",
    "RichProgress",
    "StageError",
    "algorithm",
    "decide",
    "cached_bytes",
    "cgroup_memory",
    "check",
    "check_room",
    "chunk_digests",
    "cpu_count",
    "default_workers",
    "fingerprint",
    "hash_files",
    "main",
    "rich_progress",
    "run_request",
    "scan",
    "size_text",
    "stage",
    "statvfs_free",
    "temp_path",
]
