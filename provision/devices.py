"""Host device facts: NVIDIA character-device majors and the device nodes present on the host.

The majors come from the `Character devices:` part of the host's /proc/devices, by name. Only
195 is fixed; nvidia-uvm, nvidia-caps, nvidia-nvlink, nvidia-nvswitch and the IMEX channels get a
dynamic major (254..234, then 511..384) that changes across kernels and driver loads
(docs/facts.md "NVIDIA device nodes", "Dynamic majors"), so nothing here hard-codes them.
"""

from __future__ import annotations

import re
import stat as _stat
from dataclasses import dataclass, field

from gpubox.facts import Fact

# Names the 195 line carries, depending on the driver (docs/facts.md "A real GPU machine": match them all).
FRONTEND_NAMES = ("nvidia-frontend", "nvidia", "nvidiactl")
DYNAMIC_NAMES = ("nvidia-uvm", "nvidia-caps", "nvidia-nvlink", "nvidia-nvswitch", "nvidia-caps-imex-channels")
FRONTEND_MAJOR = 195
CTL_MINOR, MODESET_MINOR = 255, 254
UVM_NODES = {"/dev/nvidia-uvm": 0, "/dev/nvidia-uvm-tools": 1}
_GPU_NODE = re.compile(r"^nvidia(\d+)$")


def char_majors(text: str) -> frozenset[int]:
    """Every major of the `Character devices:` block of /proc/devices."""
    out, in_char = set(), False
    for line in text.splitlines():
        s = line.strip()
        if s.endswith(":"):
            in_char = s == "Character devices:"
            continue
        parts = s.split(None, 1)
        if in_char and len(parts) == 2 and parts[0].isdigit():
            out.add(int(parts[0]))
    return frozenset(out)


def parse_proc_devices(text: str) -> dict[str, int]:
    """name -> major from the `Character devices:` block only (block majors can share names)."""
    out: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        s = line.strip()
        if s.endswith(":"):
            in_char = s == "Character devices:"
            continue
        if not in_char or not s:
            continue
        parts = s.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            out.setdefault(parts[1], int(parts[0]))
    return out


@dataclass
class Node:
    """A device node the container needs, and what the host has at that path."""

    path: str
    want: tuple[int, int] | None  # (major, minor) it must have; None when the major is unknown
    have: tuple[int, int] | None = None  # rdev found, None when absent
    is_char: bool = False
    required: bool = True  # False for optional nodes passed only when the host has them

    @property
    def present(self) -> bool:
        return self.have is not None

    @property
    def ok(self) -> bool:
        return self.is_char and self.want is not None and self.have == self.want


@dataclass
class HostDevices:
    """What the Proxmox host offers: majors by name, the GPU count and the nodes."""

    majors: dict[str, int]  # every char device name in /proc/devices
    gpus: int
    nodes: list[Node] = field(default_factory=list)
    # every char major registered, also those whose name another major has too (the H200's
    # /proc/devices lists infiniband_verbs at 231 and 244): `majors` keeps one major per name
    char_majors: frozenset[int] = frozenset()
    # optional nodes the host's boot files create at every boot (provision.nodehints.boot_created):
    # only those may become devN entries, which stop the start when the node is absent
    at_boot: frozenset[str] = frozenset()

    @property
    def frontend(self) -> int | None:
        for n in FRONTEND_NAMES:
            if n in self.majors:
                return self.majors[n]
        return None

    @property
    def uvm(self) -> int | None:
        return self.majors.get("nvidia-uvm")

    def nvidia_majors(self) -> dict[str, int]:
        """The NVIDIA majors in use: name -> major (one name per major)."""
        out: dict[str, int] = {}
        if self.frontend is not None:
            out["nvidia-frontend"] = self.frontend
        for n in DYNAMIC_NAMES:
            if n in self.majors:
                out[n] = self.majors[n]
        return out

    def registered(self, major: int) -> bool:
        return major in self.majors.values() or major in self.char_majors

    def node(self, path: str) -> Node | None:
        return next((n for n in self.nodes if n.path == path), None)

    def uvm_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.path in UVM_NODES]

    def pass_nodes(self) -> list[Node]:
        """Nodes to pass into the container: the wanted ones plus extra NVIDIA nodes the host has."""
        return [n for n in self.nodes if n.required or n.present]

    def majors_in_use(self) -> dict[int, str]:
        """major -> name for the nodes the container gets (what the cgroup rules must allow)."""
        names = {v: k for k, v in reversed(list(self.nvidia_majors().items()))}
        out: dict[int, str] = {}
        for n in self.pass_nodes():
            rdev = n.want or n.have
            if rdev:
                out.setdefault(rdev[0], names.get(rdev[0], "nvidia"))
        return dict(sorted(out.items()))


def gpu_count(host, default: int | None = None) -> int:
    """GPUs the driver knows (/proc/driver/nvidia/gpus/<bus id>/), else `default`, else the nodes."""
    if host.exists("/proc/driver/nvidia/gpus"):
        n = len(host.listdir("/proc/driver/nvidia/gpus"))
        if n:
            return n
    if default is not None:
        return int(default)
    if host.exists("/dev"):
        return sum(1 for x in host.listdir("/dev") if _GPU_NODE.match(x))
    return 0


def _stat_many(host, paths: list[str]) -> dict[str, tuple[bool, tuple[int, int]] | None]:
    """path -> (is_char, (major, minor)) or None. Remote hosts: one `stat` for all paths, since
    SFTP carries no st_rdev and one round trip per node adds up over SSH."""
    if host.transport.is_local:
        out = {}
        for p in paths:
            st = host.stat(p)
            out[p] = None if st is None else (st.is_char_device, st.rdev or (0, 0))
        return out
    real = {host.path(p): p for p in paths}
    r = host.run(["stat", "-L", "-c", "%n|%F|%t|%T", "--", *real], timeout=30)
    out = {p: None for p in paths}
    for line in r.stdout.splitlines():
        name, kind, ma, mi = line.rsplit("|", 3)
        if name in real:
            out[real[name]] = (kind == "character special file", (int(ma, 16), int(mi, 16)))
    return out


def _node(stats, path: str, want) -> Node:
    st = stats.get(path)
    if st is None:
        return Node(path, want)
    return Node(path, want, tuple(st[1]), bool(st[0]))


@dataclass
class DeviceScan:
    """What was read on the host: /proc/devices, the GPU count, the nodes under /dev/nvidia-caps
    and the stat of every NVIDIA node path ([is_char, [major, minor]], None when absent)."""

    proc_devices: str
    gpus: int
    caps: list[str] = field(default_factory=list)
    stats: dict[str, tuple[bool, tuple[int, int]] | None] = field(default_factory=dict)


def _wanted_paths(gpus: int) -> list[str]:
    return [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl", *UVM_NODES]


class DeviceScanFact(Fact):
    """The host's NVIDIA majors and nodes, read (no parsing) for `host_devices`."""

    @staticmethod
    def read(host, gpus: int | None = None) -> DeviceScan:
        proc = host.read_text("/proc/devices", default="")
        n = gpu_count(host, gpus)
        caps = list(host.listdir("/dev/nvidia-caps")) if host.exists("/dev/nvidia-caps") else []
        extra = ["/dev/nvidia-modeset"] + [f"/dev/nvidia-caps/{x}" for x in caps]
        return DeviceScan(proc, n, caps, _stat_many(host, _wanted_paths(n) + extra))


def host_devices(scan: DeviceScan) -> HostDevices:
    """Pure: the host's devices from a scan (majors by name, wanted and present nodes)."""
    hd = HostDevices(
        parse_proc_devices(scan.proc_devices), scan.gpus, char_majors=char_majors(scan.proc_devices)
    )
    fe = hd.frontend
    want_fe = (lambda minor: (fe, minor)) if fe is not None else (lambda minor: None)
    paths: list[tuple[str, tuple[int, int] | None]] = [
        (f"/dev/nvidia{i}", want_fe(i)) for i in range(hd.gpus)
    ]
    paths += [("/dev/nvidiactl", want_fe(CTL_MINOR))]
    uvm = hd.uvm
    paths += [(p, (uvm, m) if uvm is not None else None) for p, m in UVM_NODES.items()]
    # Optional nodes: passed through when the host has them (modeset, caps), never demanded.
    extra = ["/dev/nvidia-modeset"] + [f"/dev/nvidia-caps/{x}" for x in scan.caps]
    hd.nodes = [_node(scan.stats, p, w) for p, w in paths]
    for p in extra:
        n = _node(scan.stats, p, None)
        if n.present and n.is_char:
            n.want, n.required = n.have, False
            hd.nodes.append(n)
    return hd


# What a plan made before host-devices has loaded nvidia-uvm writes where the uvm major goes: the
# kernel assigns that major only at the module load (a dynamic one), so the plan cannot name it.
UVM_PENDING = "<nvidia-uvm major, read after modprobe>"


def predicted_dynamic_major(registered: set[int]) -> int | None:
    """The major the kernel gives the next dynamic char device: the highest free of 254..234, else
    of 511..384 (linux fs/char_dev.c find_dynamic_major). A prediction only: another driver that
    registers first takes it, which is why apply reads the real one."""
    for m in [*range(254, 233, -1), *range(511, 383, -1)]:
        if m not in registered:
            return m
    return None


def with_uvm_major(hd: HostDevices, major: int) -> HostDevices:
    """`hd` as it is once nvidia-uvm holds `major`: the uvm nodes are wanted at it."""
    nodes = [
        Node(n.path, (major, UVM_NODES[n.path]), n.have, n.is_char, n.required) if n.path in UVM_NODES else n
        for n in hd.nodes
    ]
    return HostDevices(
        {**hd.majors, "nvidia-uvm": major}, hd.gpus, nodes, hd.char_majors | {major}, hd.at_boot
    )


def read_host_devices(host, gpus: int | None = None) -> HostDevices:
    """Read /proc/devices and stat the NVIDIA nodes under the host's root."""
    return host_devices(DeviceScanFact.read(host, gpus))


def describe_rdev(rdev: tuple[int, int] | None) -> str:
    return "absent" if rdev is None else f"{rdev[0]}:{rdev[1]}"


def is_char(mode: int) -> bool:
    return _stat.S_ISCHR(mode)
