"""GPU topology of a box (bus id, NUMA node, link, memory, pair relation) and TP placement.

Sources, best first: NVML on the target (the container, then the Proxmox host) by running
nvml_probe.py's payload (gpubox.transport.payload) with python3 there; the host's sysfs (PCI functions of class 0300/0302, their
numa_node and link attributes); the inventory hint `gpubox_numa_nodes`. numa_node -1 means
"no NUMA information" (docs/facts.md "A real GPU machine"): unknown, never node 0.

`gpus_for_tp` keeps a tensor-parallel group on one NUMA node when it can: on the seed box TP4 on
one node beat TP8 across both except at 100k context (docs/facts.md "Reference figures").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpubox.errors import GpuboxError
from gpubox.readlimit import read_regular

from .pcie import list_functions

GEN_BY_SPEED = {
    "2.5": 1,
    "5.0": 2,
    "5": 2,
    "8.0": 3,
    "8": 3,
    "16.0": 4,
    "16": 4,
    "32.0": 5,
    "32": 5,
    "64.0": 6,
    "64": 6,
}


@dataclass
class Gpu:
    index: int
    bus_id: str | None = None
    name: str | None = None
    numa_node: int | None = None
    link_gen: int | None = None
    link_width: int | None = None
    max_link_gen: int | None = None
    max_link_width: int | None = None
    memory_mib: int | None = None
    uuid: str | None = None

    @property
    def link(self) -> str:
        if self.link_gen is None and self.link_width is None:
            return "?"
        s = f"Gen{self.link_gen or '?'} x{self.link_width or '?'}"
        if (
            self.max_link_gen
            and self.max_link_width
            and (self.max_link_gen, self.max_link_width) != (self.link_gen, self.link_width)
        ):
            s += f" (max Gen{self.max_link_gen} x{self.max_link_width})"
        return s


@dataclass
class Topology:
    source: str  # nvml | sysfs | inventory
    gpus: list[Gpu]
    pairs: dict[str, dict] = field(default_factory=dict)  # "i-j" -> {relation, level, nvlinks}
    driver: str | None = None
    notes: list[str] = field(default_factory=list)

    def nodes(self) -> dict[int | None, list[int]]:
        out: dict[int | None, list[int]] = {}
        for g in self.gpus:
            out.setdefault(g.numa_node, []).append(g.index)
        return out

    def relation(self, i: int, j: int) -> dict:
        a, b = min(i, j), max(i, j)
        return self.pairs.get(f"{a}-{b}", {})

    def to_dict(self) -> dict:
        d = {
            "source": self.source,
            "driver": self.driver,
            "gpus": [{**asdict(g), "link": g.link} for g in self.gpus],
            "pairs": self.pairs,
            "notes": self.notes,
        }
        d["numa_nodes"] = {str(k): v for k, v in self.nodes().items()}
        return d


def from_nvml_doc(doc: dict) -> Topology:
    """A Topology from nvml_probe's JSON (live or recorded)."""
    gpus = [Gpu(**{k: g.get(k) for k in Gpu.__dataclass_fields__}) for g in doc["gpus"]]
    notes = [f"NVML: {e}" for e in doc.get("errors", [])]
    return Topology("nvml", gpus, dict(doc.get("pairs", {})), doc.get("driver"), notes)


def from_nvml(nvml, read_numa=None) -> Topology:
    """Topology from a pynvml-like module, in this process (tests feed recorded data). NUMA nodes
    NVML cannot tell come from `read_numa(bus_id)` when given (never this machine's /sys here)."""
    from .nvml_probe import collect

    return from_nvml_doc(collect(nvml, read_numa=read_numa))


def probe_nvml(host) -> dict | None:
    """Run nvml_probe on a host (local, SSH or pct): its JSON, or None when NVML is not there."""
    from gpubox.transport import payload  # control side only: this module also runs in the box

    r = payload.run(host, "gpubox.hwtune.nvml_probe", timeout=60)
    if r.rc != 0:
        return None
    try:
        doc = json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return None
    return doc if doc.get("gpus") else None


def _gen(text: str) -> int | None:
    return GEN_BY_SPEED.get(text.split(" ")[0]) if text else None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def from_sysfs(host) -> Topology:
    """GPU functions from the host's sysfs; NVLink is invisible there, so pairs are PCIe."""
    funcs = [f for f in list_functions(host) if f.vendor == "0x10de" and f.kind == "gpu"]
    gpus = []
    for i, f in enumerate(sorted(funcs, key=lambda f: f.bdf)):  # nvidia-smi order: PCI bus id
        attr = lambda n: host.read_text(f"/sys/bus/pci/devices/{f.bdf}/{n}", default="").strip()  # noqa: E731, B023 - used in this iteration
        gpus.append(
            Gpu(
                i,
                f.bdf,
                None,
                f.numa_node,
                _gen(attr("current_link_speed")),
                _int(attr("current_link_width")),
                _gen(attr("max_link_speed")),
                _int(attr("max_link_width")),
            )
        )
    pairs = {}
    for a in gpus:
        for b in gpus:
            if a.index < b.index:
                if a.numa_node is None or b.numa_node is None:
                    level = None
                else:
                    level = "NODE" if a.numa_node == b.numa_node else "SYS"
                pairs[f"{a.index}-{b.index}"] = {"relation": "PCIe", "level": level, "nvlinks": None}
    return Topology(
        "sysfs",
        gpus,
        pairs,
        notes=["from sysfs: NVLink and memory not visible; same-node pairs shown as NODE (at most)"],
    )


def from_inventory(box) -> Topology:
    hint = box.var("gpubox_numa_nodes") or {}
    count = int(box.var("gpubox_gpus", 0) or 0)
    node_of: dict[int, int] = {}
    for node, idxs in hint.items():
        for i in idxs or []:
            node_of[int(i)] = int(node)
    n = max([count, *(i + 1 for i in node_of)]) if (count or node_of) else 0
    gpus = [Gpu(i, numa_node=node_of.get(i)) for i in range(n)]
    return Topology("inventory", gpus, notes=["from the inventory hint gpubox_numa_nodes: no live data"])


def discover(ctx) -> Topology:
    """Best available source for the box (see module doc)."""
    notes = []
    if not ctx.box.var("gpubox_simulated"):  # a simulated box has no GPU for NVML to find
        for host in (ctx.container, ctx.host):
            try:
                doc = probe_nvml(host)
            except GpuboxError as exc:
                notes.append(f"NVML on {host.name}: {exc}")
                continue
            if doc:
                topo = from_nvml_doc(doc)
                topo.notes.insert(0, f"NVML on {host.name}")
                _fill_numa_from_sysfs(ctx, topo)
                return topo
            notes.append(f"NVML not available on {host.name}")
    topo = from_sysfs(ctx.host)
    if topo.gpus:
        topo.notes = notes + topo.notes
        return topo
    topo = from_inventory(ctx.box)
    topo.notes = notes + ["no NVIDIA GPU functions in the host's sysfs"] + topo.notes
    return topo


def _fill_numa_from_sysfs(ctx, topo: Topology) -> None:
    """NVML in a container often cannot tell the NUMA node; the host's sysfs can."""
    if all(g.numa_node is not None for g in topo.gpus):
        return
    try:
        nodes = {f.bdf: f.numa_node for f in list_functions(ctx.host)}
    except GpuboxError:
        return
    for g in topo.gpus:
        if g.numa_node is None and g.bus_id in nodes:
            g.numa_node = nodes[g.bus_id]


@dataclass
class TpChoice:
    tp: int
    gpus: list[int]
    fits: bool
    numa_nodes: list[int | None]
    crosses_numa: bool | None  # None: NUMA placement unknown
    reason: str

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))

    def to_dict(self) -> dict:
        return {**asdict(self), "cuda_visible_devices": self.cuda_visible_devices}


def gpus_for_tp(topology: Topology, n: int) -> TpChoice:
    """n GPUs for one tensor-parallel group, on one NUMA node when possible (lowest node and
    indices first: TP4 on an 8-GPU 2-node box -> 0-3); says when it must cross nodes or cannot fit."""
    if int(n) < 1:
        raise GpuboxError(f"TP size {n} is not a positive number", "use 1, 2, 4, 8, ...")
    n = int(n)
    total = len(topology.gpus)
    if n > total:
        return TpChoice(n, [], False, [], None, f"TP{n} needs {n} GPUs; the box has {total}")
    nodes = topology.nodes()
    if set(nodes) == {None}:
        picked = [g.index for g in topology.gpus][:n]
        return TpChoice(
            n,
            picked,
            True,
            [None],
            None,
            "NUMA placement unknown (numa_node -1 or no data): first GPUs by index",
        )
    for node in sorted(k for k in nodes if k is not None):
        if len(nodes[node]) >= n:
            return TpChoice(n, nodes[node][:n], True, [node], False, f"all on NUMA node {node}")
    # Must cross: fill from the largest known nodes first so the group spans as few nodes as possible.
    picked, used = [], []
    for node in sorted(nodes, key=lambda k: (k is None, -len(nodes[k]), k if k is not None else 0)):
        take = nodes[node][: n - len(picked)]
        if take:
            picked += take
            used.append(node)
        if len(picked) == n:
            break
    return TpChoice(
        n,
        sorted(picked),
        True,
        used,
        True,
        f"TP{n} must cross NUMA nodes {', '.join(map(str, used))}: no node has {n} GPUs "
        f"(largest has {max(len(v) for k, v in nodes.items() if k is not None)}); "
        "expect cross-socket traffic",
    )


def discover_local() -> Topology:
    """This machine's GPUs, read directly (no inventory, no transport): NVML in this process,
    NUMA nodes NVML cannot tell from this machine's sysfs. An empty Topology says why it is empty."""
    import socket

    try:
        import pynvml
    except ImportError as exc:
        return Topology("none", [], notes=[f"pynvml not importable ({exc}): pip install nvidia-ml-py"])
    from .nvml_probe import collect

    try:
        doc = collect(pynvml)
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no GPU stack here
        return Topology("none", [], notes=[f"NVML not available: {type(exc).__name__}: {exc}"])
    topo = from_nvml_doc(doc)
    topo.notes.insert(0, f"NVML on {socket.gethostname()} (local)")
    return topo


def from_file(path: str) -> Topology:
    """A topology recorded earlier: nvml_probe.py output or `gpubox gpus --json` output."""
    try:
        doc = json.loads(read_regular(path, 64 << 20, what="topology file"))
    except OSError as exc:
        raise GpuboxError(
            f"cannot read {path}: {exc.strerror}", "give the path of a topology JSON file"
        ) from None
    except ValueError:
        raise GpuboxError(
            f"{path} is not JSON", "give nvml_probe.py output or `gpubox gpus --json` output"
        ) from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("gpus"), list)
        or not all(isinstance(g, dict) and isinstance(g.get("index"), int) for g in doc["gpus"])
    ):
        raise GpuboxError(
            f"{path} has no list of GPUs with an index",
            "give nvml_probe.py output or `gpubox gpus --json` output",
        )
    topo = from_nvml_doc(doc)
    topo.source = str(doc.get("source") or "file")
    topo.notes = list(doc.get("notes") or topo.notes) + [f"recorded: {Path(path).name}"]
    return topo
