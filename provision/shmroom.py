"""Room in the container's /dev/shm for NCCL after the weights are staged there.

NCCL's SHM transport (and its proxy and cuMem fallbacks) creates /dev/shm/nccl-* segments of a
few MB to a few hundred MB per peer connection; when the tmpfs is full or small, init fails with
`NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXX (size 9637888)` /
`failed to extend ... No space left on device` (NCCL docs, Troubleshooting: "Shared memory";
NVIDIA/nccl#290, #342, #525, #1683; NVIDIA/nccl-tests#166; pytorch/torchtitan#853 with a 16 MB
/dev/shm on 8 GPUs, fixed at 1 GB). Here the same tmpfs holds the staged model (tens of GB), so
the question is what is left after staging, in the tmpfs AND under the container's memory limit
(tmpfs pages are charged to the container's memory cgroup).

The floor, 1 GiB for up to 8 ranks on one node (more ranks scale it), is the working size those
reports settled on; it is not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.facts import Fact

GIB = 1 << 30
SHM = "/dev/shm"


@dataclass
class ShmFacts:
    size: int | None = None  # bytes, /dev/shm filesystem size
    free: int | None = None  # bytes available
    mem_max: int | None = None  # container memory.max (None = unlimited/unknown)
    mem_current: int | None = None  # container memory.current


def need_bytes(ranks: int) -> int:
    return GIB * max(1, -(-max(ranks, 1) // 8))


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.0f} MiB"


def decide(f: ShmFacts, ranks: int) -> tuple[str, str, str | None, str | None]:
    """Pure: (status, detail, cause, repair) for NCCL's room in /dev/shm at `ranks` GPUs."""
    if f.free is None:
        return "skipped", f"{SHM} could not be read", None, None
    need = need_bytes(ranks)
    room = f.free
    where = f"{SHM} has {_gib(f.free)} free of {_gib(f.size or 0)}"
    if f.mem_max is not None and f.mem_current is not None:
        head = max(0, f.mem_max - f.mem_current)
        where += f"; the container's memory limit leaves {_gib(head)}"
        room = min(room, head)
    if room >= need:
        return "ok", f"{where}: room for NCCL at {ranks} GPU(s) (needs {_gib(need)})", None, None
    return (
        "failed",
        f"{where}: NCCL at {ranks} GPU(s) needs about {_gib(need)}",
        "NCCL cannot create its shared-memory segments ('Error while creating shared memory segment "
        "/dev/shm/nccl-...'): the container's /dev/shm (a tmpfs, also holding the staged weights) is "
        "too small or full",
        "raise the container's /dev/shm size: in the CT `mount -o remount,size=<N>G /dev/shm` and "
        "`tmpfs /dev/shm tmpfs defaults,size=<N>G 0 0` in its /etc/fstab (Docker inside it: "
        "--shm-size / shm_size), and its memory (pct set <vmid> --memory <MiB>) since tmpfs pages "
        "count against it; or stage less into /dev/shm. NCCL_SHM_DISABLE=1 only as a last resort "
        "(slower)",
    )


def _int(text: str) -> int | None:
    t = (text or "").strip()
    return int(t) if t.isdigit() else None


class ShmFact(Fact):
    """df of /dev/shm and the container's own memory cgroup (cgroup2 namespace: /sys/fs/cgroup)."""

    where = "container"

    @staticmethod
    def read(host) -> ShmFacts:
        if not host.exists(SHM):
            return ShmFacts()
        r = host.run(["df", "-B1", "--output=size,avail", host.path(SHM)], timeout=30)
        rows = [ln.split() for ln in r.stdout.splitlines()[1:] if ln.split()]
        size, free = (int(rows[0][0]), int(rows[0][1])) if rows and len(rows[0]) == 2 else (None, None)
        mx = _int(host.read_text("/sys/fs/cgroup/memory.max", default=""))
        cur = _int(host.read_text("/sys/fs/cgroup/memory.current", default=""))
        return ShmFacts(size, free, mx, cur)
