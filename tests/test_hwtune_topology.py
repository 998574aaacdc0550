"""GPU topology: sysfs of the simulated host, NVML from recorded data, TP placement, `gpubox gpus`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gpubox.context import Context
from gpubox.errors import GpuboxError
from gpubox.hwtune.topology import Gpu, Topology, discover, from_inventory, from_nvml, from_sysfs, gpus_for_tp
from gpubox.inventory import Inventory
from gpubox.simbox import build

# A pynvml-shaped module over recorded values (NVML itself cannot run without a GPU). Errors are
# raised the way pynvml raises them: an NVMLError subclass per return code.
FAKE_PYNVML = textwrap.dedent("""
    import json, os
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    class NVMLError(Exception):
        pass
    class NVMLError_NotSupported(NVMLError):
        pass
    _doc = None
    def _d():
        global _doc
        if _doc is None:
            _doc = json.load(open(os.environ["FAKE_NVML_DOC"]))
        return _doc
    class _O:
        def __init__(self, **kw): self.__dict__.update(kw)
    def _v(h, key):
        v = _d()["devices"][h][key]
        if v == "NotSupported":
            raise NVMLError_NotSupported("Not Supported")
        return v
    def nvmlInit(): _d()
    def nvmlShutdown(): pass
    def nvmlSystemGetDriverVersion(): return _d()["driver"]
    def nvmlDeviceGetCount(): return len(_d()["devices"])
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetName(h): return _v(h, "name")
    def nvmlDeviceGetUUID(h): return _v(h, "uuid")
    def nvmlDeviceGetPciInfo(h): return _O(busId=_v(h, "busId").encode())
    def nvmlDeviceGetMemoryInfo(h): return _O(total=_v(h, "memory_total"))
    def nvmlDeviceGetNumaNodeId(h): return _v(h, "numa")
    def nvmlDeviceGetCurrPcieLinkGeneration(h): return _v(h, "gen")
    def nvmlDeviceGetCurrPcieLinkWidth(h): return _v(h, "width")
    def nvmlDeviceGetMaxPcieLinkGeneration(h): return _v(h, "max_gen")
    def nvmlDeviceGetMaxPcieLinkWidth(h): return _v(h, "max_width")
    def nvmlDeviceGetNvLinkState(h, link):
        links = _v(h, "nvlinks")
        if not links:
            raise NVMLError_NotSupported("Not Supported")
        if link >= len(links):
            raise NVMLError("Invalid Argument")
        return NVML_FEATURE_ENABLED
    def nvmlDeviceGetNvLinkRemotePciInfo(h, link): return _O(busId=_v(h, "nvlinks")[link])
    def nvmlDeviceGetTopologyCommonAncestor(a, b):
        return _d()["common_ancestor"][f"{min(a, b)}-{max(a, b)}"]
""")

# The H200 VM of docs/facts.md: one GPU at 0000:00:06.0, numa_node -1, Gen5 x16, driver 580.159.04.
H200 = {
    "driver": "580.159.04",
    "common_ancestor": {},
    "devices": [
        {
            "name": "NVIDIA H200",
            "uuid": "GPU-0",
            "busId": "00000000:00:06.0",
            "memory_total": 150754820096,
            "numa": "NotSupported",
            "gen": 5,
            "width": 16,
            "max_gen": 5,
            "max_width": 16,
            "nvlinks": [],
        }
    ],
}


def eight_gpu_doc(nvlink: bool) -> dict:
    """8 GPUs, 2 NUMA nodes; with nvlink, GPU pairs (0,1),(2,3).. joined by 4 links each."""
    buses = [
        "00000000:17:00.0",
        "00000000:3D:00.0",
        "00000000:63:00.0",
        "00000000:89:00.0",
        "00000000:97:00.0",
        "00000000:BD:00.0",
        "00000000:E3:00.0",
        "00000000:E9:00.0",
    ]
    devs = []
    for i, b in enumerate(buses):
        peer = buses[i ^ 1]
        devs.append(
            {
                "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                "uuid": f"GPU-{i}",
                "busId": b,
                "memory_total": 102641958912,
                "numa": 0 if i < 4 else 1,
                "gen": 1 if i == 5 else 5,
                "width": 16,
                "max_gen": 5,
                "max_width": 16,
                "nvlinks": [peer] * 4 if nvlink else [],
            }
        )
    anc = {f"{i}-{j}": (40 if (i < 4) == (j < 4) else 50) for i in range(8) for j in range(i + 1, 8)}
    return {"driver": "580.95.05", "common_ancestor": anc, "devices": devs}


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """Import the pynvml-shaped module over a recorded document."""
    import importlib.util

    def load(doc):
        (tmp_path / "doc.json").write_text(json.dumps(doc))
        (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
        monkeypatch.setenv("FAKE_NVML_DOC", str(tmp_path / "doc.json"))
        spec = importlib.util.spec_from_file_location(f"fake_pynvml_{id(doc)}", tmp_path / "pynvml.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


def test_nvml_h200_numa_unknown_is_not_node_zero(fake_nvml):
    topo = from_nvml(fake_nvml(H200))
    g = topo.gpus[0]
    assert (g.bus_id, g.numa_node, g.link, g.memory_mib) == ("0000:00:06.0", None, "Gen5 x16", 143771)
    assert topo.driver == "580.159.04" and topo.source == "nvml"
    assert any("numa" in n for n in topo.notes)  # NotSupported is recorded, not fatal
    ch = gpus_for_tp(topo, 1)
    assert ch.gpus == [0] and ch.crosses_numa is None and "unknown" in ch.reason


def test_nvml_numa_from_sysfs_reader_when_nvml_cannot_tell(fake_nvml):
    topo = from_nvml(fake_nvml(H200), read_numa=lambda bus: 1 if bus == "0000:00:06.0" else None)
    assert topo.gpus[0].numa_node == 1


def test_nvml_pairs_nvlink_and_pcie_levels(fake_nvml):
    topo = from_nvml(fake_nvml(eight_gpu_doc(nvlink=True)))
    assert [g.bus_id for g in topo.gpus][:2] == ["0000:17:00.0", "0000:3d:00.0"]
    assert topo.relation(0, 1) == {"relation": "NV4", "level": "NODE", "nvlinks": 4}
    assert topo.relation(1, 2)["relation"] == "PCIe" and topo.relation(1, 2)["level"] == "NODE"
    assert topo.relation(3, 4)["level"] == "SYS"
    assert topo.gpus[5].link == "Gen1 x16 (max Gen5 x16)"  # idle GPU: speed down, reported as is
    pcie_only = from_nvml(fake_nvml(eight_gpu_doc(nvlink=False)))
    assert all(p["relation"] == "PCIe" for p in pcie_only.pairs.values())


def test_gpus_for_tp_prefers_one_numa_node(fake_nvml):
    topo = from_nvml(fake_nvml(eight_gpu_doc(nvlink=False)))
    tp4 = gpus_for_tp(topo, 4)
    assert tp4.gpus == [0, 1, 2, 3] and tp4.crosses_numa is False and tp4.cuda_visible_devices == "0,1,2,3"
    tp8 = gpus_for_tp(topo, 8)
    assert tp8.fits and tp8.crosses_numa and "must cross NUMA nodes" in tp8.reason
    tp16 = gpus_for_tp(topo, 16)
    assert not tp16.fits and "the box has 8" in tp16.reason
    with pytest.raises(GpuboxError):
        gpus_for_tp(topo, 0)


def test_gpus_for_tp_uneven_nodes():
    topo = Topology("x", [Gpu(0, numa_node=0), Gpu(1, numa_node=1), Gpu(2, numa_node=1), Gpu(3, numa_node=1)])
    assert gpus_for_tp(topo, 2).gpus == [1, 2]  # node 0 has one GPU only
    three = gpus_for_tp(topo, 3)
    assert three.gpus == [1, 2, 3] and three.crosses_numa is False
    four = gpus_for_tp(topo, 4)
    assert four.crosses_numa and four.numa_nodes == [1, 0]


def make(tmp_path, faults=(), gpus=8, **extra_ct):
    sim = build(tmp_path / "box", faults, gpus=gpus)
    sim.inventory_extra["container"].update(extra_ct)
    sim.write_inventory()
    inv = Inventory(sim.inventory_path)
    return sim, Context(box=inv.box("ct200"), inventory=inv, options={})


def test_sysfs_topology_of_simulated_host(tmp_path):
    _, ctx = make(tmp_path, ["link_degraded"])
    topo = from_sysfs(ctx.host)
    assert len(topo.gpus) == 8 and topo.source == "sysfs"
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpus[2].link == "Gen4 x8 (max Gen5 x16)" and topo.gpus[0].link == "Gen5 x16"
    assert topo.relation(0, 3)["level"] == "NODE" and topo.relation(3, 4)["level"] == "SYS"
    assert gpus_for_tp(topo, 4).gpus == [0, 1, 2, 3]


def test_sysfs_numa_minus_one_is_unknown(tmp_path):
    sim, ctx = make(tmp_path, gpus=2)
    for d in sim.hpath("/sys/bus/pci/devices").iterdir():
        (d / "numa_node").write_text("-1\n")
    topo = from_sysfs(ctx.host)
    assert [g.numa_node for g in topo.gpus] == [None, None]
    assert gpus_for_tp(topo, 2).crosses_numa is None


def test_inventory_hint():
    class Box:
        def var(self, k, d=None):
            return {"gpubox_numa_nodes": {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, "gpubox_gpus": 8}.get(k, d)

    topo = from_inventory(Box())
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1] and topo.source == "inventory"


def test_discover_runs_the_probe_on_the_container(tmp_path):
    """Not simulated: the real probe script runs in a real `python3 -` on the container host, over
    the pynvml-shaped module (the only stand-in: there is no GPU here)."""
    fake = tmp_path / "fakenvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    (fake / "doc.json").write_text(json.dumps(eight_gpu_doc(nvlink=True)))
    sim, ctx = make(
        tmp_path,
        gpubox_simulated=False,
        gpubox_env={"PYTHONPATH": str(fake), "FAKE_NVML_DOC": str(fake / "doc.json")},
    )
    topo = discover(ctx)
    assert topo.source == "nvml" and topo.notes[0] == "NVML on ct200"
    assert topo.relation(0, 1)["relation"] == "NV4" and len(topo.gpus) == 8


def test_gpus_cli_json_on_simulated_box(tmp_path):
    sim, _ = make(tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpubox.cli",
            "-i",
            str(sim.inventory_path),
            "gpus",
            "ct200",
            "--tp",
            "4",
            "--tp",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"] == "sysfs" and len(doc["gpus"]) == 8
    assert doc["tp"][0]["gpus"] == [0, 1, 2, 3] and doc["tp"][1]["crosses_numa"] is True
    r = subprocess.run(
        [sys.executable, "-m", "gpubox.cli", "-i", str(sim.inventory_path), "gpus", "ct200"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0 and "TP4: 0,1,2,3" in r.stdout and "SYS" in r.stdout


def test_recorded_real_h200_probe_output():
    """nvml_probe.py's output recorded on a real H200 VM (driver 580.159.04) by the GPU-probe work."""
    from pathlib import Path

    from gpubox.hwtune.topology import from_nvml_doc

    p = Path(__file__).parent / "fixtures" / "topology" / "h200_nvml_probe.json"
    if not p.exists():
        pytest.skip("recorded H200 fixture not present")
    topo = from_nvml_doc(json.loads(p.read_text()))
    g = topo.gpus[0]
    assert (g.name, g.bus_id, g.numa_node, g.link, g.memory_mib) == (
        "NVIDIA H200",
        "0000:00:06.0",
        None,
        "Gen5 x16",
        143771,
    )
    assert topo.driver == "580.159.04" and any("NotSupported" in n for n in topo.notes)
    assert gpus_for_tp(topo, 1).gpus == [0] and not gpus_for_tp(topo, 4).fits
