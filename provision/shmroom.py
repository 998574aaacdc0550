"""Room in the container's /dev/shm for NCCL after the weights are staged there.

NCCL's SHM transport (and its proxy and cuMem fallbacks) creates /dev/shm/nccl-* segments of a
few MB to a few hundred MB per peer connection; when the tmpfs is full or small, init fails with
`NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXX (size 9637888)` /
`failed to extend ... No space left on device` (NCCL docs, Troubleshooting: "Shared memory";
NVIDIA/nccl#290, #342, #525, #1683; NVIDIA/nccl-tests#166; pytorch/torchtitan#853 with a 16 MB
/dev/shm on 8 GPUs, fixed at 1 GB). Here the same tmpfs holds the staged model (tens of GB), so
the question is what is left after staging, in the tmpfs AND under the container's memory limit
(tmpfs pages are charged to the container's memory cgroup).

The room scales with the ranks on the node: the segments are made per peer connection (NCCL's
SHM transport between ranks, its proxy buffers), so a single rank has no peer and makes none --
no room is demanded of a 1-GPU box (vLLM's own guidance: "For single-GPU deployments with
tensor_parallel_size=1, the default container shared memory is typically sufficient", vllm#49568).
For two or more ranks, 128 MiB per rank: 1 GiB at 8 ranks, the working size those reports settled
on (torchtitan#853); it is not measured here.

Where the tmpfs comes from decides the repair. A Proxmox container whose config mounts its own
tmpfs at dev/shm (`lxc.mount.entry: tmpfs dev/shm tmpfs size=512M,...`) gets that size from the
host at every start: a remount or an fstab line inside the container is undone at the next start
(saihgupr/frigate-proxmox-script#17: "the value reverts to 512MB after every reboot"), so the
finding names that line of the CT config as the place to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.facts import Fact

from .lxcconf import LxcConf, fields

GIB = 1 << 30
MIB = 1 << 20
PER_RANK = 128 * MIB  # 1 GiB at 8 ranks (torchtitan#853)
SHM = "/dev/shm"


@dataclass
class ShmFacts:
    size: int | None = None  # bytes, /dev/shm filesystem size
    free: int | None = None  # bytes available
    mem_max: int | None = None  # container memory.max (None = unlimited/unknown)
    mem_current: int | None = None  # container memory.current
    host_mount: str | None = None  # the CT config's lxc.mount.entry for dev/shm (host-sized tmpfs)


def need_bytes(ranks: int) -> int:
    """NCCL's room at `ranks` GPUs on the node: none for one (no peer, no segment)."""
    return 0 if ranks <= 1 else PER_RANK * ranks


def host_mount(conf_text: str) -> str | None:
    """Pure: the value of the main section's `lxc.mount.entry` that mounts a tmpfs at dev/shm
    (target relative or absolute, as LXC takes both), None when the container's /dev/shm is its own."""
    for line in LxcConf.parse(conf_text or "").main.lines:
        if line.key != "lxc.mount.entry" or not line.value:
            continue
        f = fields(line.value.split("#", 1)[0])
        if len(f) >= 3 and f[1].strip("/") == "dev/shm" and f[2] == "tmpfs":
            return " ".join(f)
    return None


def mount_size(entry: str | None) -> str | None:
    """The size= option of a mount entry's options field, as written (e.g. "512M")."""
    f = fields(entry or "")
    opts = f[3].split(",") if len(f) > 3 else []
    got = [o.split("=", 1)[1] for o in opts if o.startswith("size=")]
    return got[-1] if got else None


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.0f} MiB"


CAUSE = (
    "NCCL cannot create its shared-memory segments ('Error while creating shared memory segment "
    "/dev/shm/nccl-...'): the container's /dev/shm (a tmpfs, also holding the staged weights) is "
    "too small or full"
)
ENTRY = "tmpfs dev/shm tmpfs size=<N>G,nosuid,nodev,create=dir 0 0"
TAIL = (
    "and its memory (pct set {vmid} --memory <MiB>) since tmpfs pages count against it; or stage "
    "less into /dev/shm. NCCL_SHM_DISABLE=1 only as a last resort (slower)"
)


def decide(f: ShmFacts, ranks: int, vmid: int | None = None) -> tuple[str, str, str | None, str | None]:
    """Pure: (status, detail, cause, repair) for NCCL's room in /dev/shm at `ranks` GPUs."""
    if f.free is None:
        return "skipped", f"{SHM} could not be read", None, None
    need = need_bytes(ranks)
    room = f.free
    where = f"{SHM} has {_gib(f.free)} free of {_gib(f.size or 0)}"
    if f.host_mount:
        where += f" (sized by the host: size={mount_size(f.host_mount) or 'default'} in the CT config)"
    if f.mem_max is not None and f.mem_current is not None:
        head = max(0, f.mem_max - f.mem_current)
        where += f"; the container's memory limit leaves {_gib(head)}"
        room = min(room, head)
    if need == 0:
        return "ok", f"{where}: 1 GPU, NCCL makes no shared-memory segments without a peer", None, None
    if room >= need:
        return "ok", f"{where}: room for NCCL at {ranks} GPU(s) (needs {_gib(need)})", None, None
    ct = str(vmid) if vmid is not None else "<vmid>"
    tail = TAIL.format(vmid=ct)
    detail = f"{where}: NCCL at {ranks} GPU(s) needs about {_gib(need)}"
    if f.host_mount:
        return (
            "failed",
            detail,
            f"{CAUSE}; its size comes from the host: /etc/pve/lxc/{ct}.conf mounts it "
            f"(`lxc.mount.entry: {f.host_mount}`) at every start, so a remount or an fstab line "
            "inside the container is undone at the next start",
            f"raise the container's /dev/shm size on the host: size= in that lxc.mount.entry line "
            f"of /etc/pve/lxc/{ct}.conf (e.g. size=<N>G), then pct reboot {ct}; {tail}",
        )
    return (
        "failed",
        detail,
        CAUSE,
        "raise the container's /dev/shm size on the host, where it survives restarts: add "
        f"`lxc.mount.entry: {ENTRY}` to the "
        f"main section of /etc/pve/lxc/{ct}.conf, then pct reboot {ct} (a remount inside the "
        "container is lost at its next start; Docker inside it: --shm-size / shm_size); "
        f"{tail}",
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
