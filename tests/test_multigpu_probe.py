"""Multi-GPU probe documents and topology (issue 12), on CPU: the verdict and the P2P matrix on
SYNTHETIC 2/4/8-GPU documents shaped like hwtune/probe.py output (tests/fixtures/probe/
make_synthetic.py says how they were made; they stand in until a real multi-GPU run is
recorded), `gpubox gpus --local/--input`, gpus_for_tp on 8 GPUs over 2 NUMA nodes, and
benchmarks/multigpu_run.sh end to end on a machine without GPUs."""

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.hwtune import probe as probe_script
from gpubox.hwtune import probe_bandwidth
from gpubox.hwtune.gpu_probe_step import probe_args
from gpubox.hwtune.probe_verdict import decide, limits
from gpubox.hwtune.topology import from_file, gpus_for_tp
from tests.clirun import gpubox

ROOT = Path(__file__).resolve().parents[1]
PFIX = ROOT / "tests" / "fixtures" / "probe"
TFIX = ROOT / "tests" / "fixtures" / "topology"


def load(name):
    return json.loads((PFIX / name).read_text())


def by_name(checks):
    return {c.name: c for c in checks}


@pytest.mark.parametrize(
    "name,gpus,pairs,sets",
    [
        ("synthetic_2gpu_h200_nvlink.json", 2, 2, 1),
        ("synthetic_4gpu_h200_nvlink.json", 4, 12, 3),
        ("synthetic_8gpu_pcie.json", 8, 56, 7),
    ],
)
def test_synthetic_documents_are_marked_and_judged_healthy(name, gpus, pairs, sets):
    doc = load(name)
    assert doc["synthetic"] is True and "SYNTHETIC" in doc["note"]
    checks = decide(doc, limits(), expect_gpus=gpus)
    assert [c.name for c in checks if c.status != "ok"] == []
    assert sum(c.name.startswith("p2p ") for c in checks) == pairs
    assert sum(c.name.startswith("allreduce ") for c in checks) == sets
    assert sum(c.name.endswith(" link") for c in checks) == gpus


def test_cross_numa_pair_without_peer_access_is_drift():
    doc = load("synthetic_8gpu_pcie.json")
    for p in doc["bandwidth"]["probes"]:
        if p["name"] == "p2p" and (p["src"] < 4) != (p["dst"] < 4):
            p.update(peer_access=False, gbps=19.6)
    c = by_name(decide(doc))
    assert c["p2p gpu0->gpu4"].status == "drift" and "without peer access" in c["p2p gpu0->gpu4"].detail
    assert "ACS" in c["p2p gpu0->gpu4"].repair
    assert c["p2p gpu0->gpu1"].status == "ok"
    assert sum(x.status == "drift" for x in c.values()) == 32  # 4 x 4 pairs, both directions


def test_slow_tp8_allreduce_is_drift_and_its_floor_is_the_slowest_link():
    doc = load("synthetic_8gpu_pcie.json")
    ar = next(p for p in doc["bandwidth"]["probes"] if p["name"] == "allreduce" and len(p["gpus"]) == 8)
    ar["busbw_gbps"] = 15.0  # 24% of Gen5 x16 (63 GB/s), limit 30%
    c = by_name(decide(doc))["allreduce 0,1,2,3,4,5,6,7"]
    assert c.status == "drift" and "24% of slowest hop" in c.detail and "PCIe 63.0 GB/s" in c.detail
    # the same busbw over a set with one GPU at Gen4 is judged against Gen4 x16 (31.5 GB/s): 48%, ok
    doc2 = copy.deepcopy(doc)
    doc2["nvml"]["gpus"][5]["pcie"].update(gen_max=4, gen_gpu_max=4)
    assert by_name(decide(doc2))["allreduce 0,1,2,3,4,5,6,7"].status == "ok"


def test_nvlink_box_judged_with_an_absolute_busbw_floor():
    doc = load("synthetic_4gpu_h200_nvlink.json")
    ok = by_name(decide(doc, limits({"allreduce_min_busbw_gbps": 300})))
    assert ok["allreduce 0,1,2,3"].status == "ok" and "min 300 GB/s" in ok["allreduce 0,1,2,3"].detail
    slow = by_name(decide(doc, limits({"allreduce_min_busbw_gbps": 355})))
    assert slow["allreduce 0,1,2,3"].status == "drift" and slow["allreduce 0,1"].status == "drift"


def test_probe_cli_on_synthetic_8gpu_shows_the_p2p_matrix(capsys, tmp_path):
    rc, out, _ = gpubox(capsys, "probe", "--input", str(PFIX / "synthetic_8gpu_pcie.json"))
    assert rc == 0 and "P2P copy GB/s" in out
    row0 = next(line for line in out.splitlines() if line.strip("│ ").startswith("GPU0 ") and "51.7" in line)
    cells = [c.strip() for c in row0.strip("│").split("│")]
    assert cells == ["GPU0", "-", "51.7", "51.7", "51.7", "37.9", "37.9", "37.9", "37.9"]
    doc = load("synthetic_8gpu_pcie.json")
    for p in doc["bandwidth"]["probes"]:
        if p["name"] == "p2p" and (p["src"], p["dst"]) == (0, 4):
            p.update(peer_access=False, gbps=19.6)
    f = tmp_path / "nopeer.json"
    f.write_text(json.dumps(doc))
    rc, out, _ = gpubox(capsys, "probe", "--input", str(f))
    assert rc == 1 and "19.6*" in out


def test_probe_cli_bad_pairs_and_sets_are_bad_input(capsys):
    rc, _, err = gpubox(capsys, "probe", "--local", "--p2p-pairs", "0-x")
    assert rc == 2 and "--p2p-pairs '0-x' is not a list of GPU pairs" in err
    rc, _, err = gpubox(capsys, "probe", "--local", "--allreduce-sets", "0,a")
    assert rc == 2 and "is not a list of GPU index sets" in err
    rc, _, err = gpubox(capsys, "probe", "ct200", "--nccl-compare", "pcie-2numa")
    assert rc == 2 and "gpubox probe --local --nccl-compare" in err


def test_probe_args_pass_pairs_to_the_remote_script():
    args = probe_args(quick=True, bandwidth=True, sets=[[0, 1], [0, 1, 2, 3]], p2p_pairs=[(0, 1), (0, 4)])
    assert args == ["--quick", "--allreduce-sets", "0,1;0,1,2,3", "--p2p-pairs", "0-1,0-4"]
    assert probe_script.parse_pairs(args[-1]) == [(0, 1), (0, 4)]


def test_allreduce_sizes_and_iterations():
    assert probe_script.parse_bytes("1048576, 1M,256MiB,1G,64k") == [
        1 << 20,
        1 << 20,
        256 << 20,
        1 << 30,
        64 << 10,
    ]
    sz = probe_bandwidth.SIZES["full"]
    assert probe_bandwidth._ar_iters(sz, 256 << 20) == sz["ar_iters"]  # the default size: default count
    assert probe_bandwidth._ar_iters(sz, 1 << 30) == sz["ar_iters"]  # never fewer
    assert (
        probe_bandwidth._ar_iters(sz, 16 << 20) == 160 and probe_bandwidth._ar_iters(sz, 1 << 20) == 200
    )  # capped
    r = subprocess.run(
        [sys.executable, str(ROOT / "hwtune" / "probe.py"), "--allreduce-bytes", "1Q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "give sizes like" in r.stderr


def test_probe_script_records_the_collective_environment():
    env = {**os.environ, "NCCL_PROTO": "LL", "NVSHMEM_DISABLE_NVLS": "1", "UNRELATED": "x"}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "hwtune" / "probe.py"),
            "--no-copies",
            "--no-p2p",
            "--allreduce-bytes",
            "1M",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    doc = json.loads(r.stdout)
    assert doc["env"]["NCCL_PROTO"] == "LL" and doc["env"]["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "UNRELATED" not in doc["env"]


# -- topology ------------------------------------------------------------------------------------
def test_gpus_for_tp_on_synthetic_8gpu_2numa():
    topo = from_file(str(TFIX / "synthetic_8gpu_2numa_pcie.json"))
    assert topo.nodes() == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    picks = {n: gpus_for_tp(topo, n) for n in (1, 2, 4, 8)}
    assert [picks[n].gpus for n in (1, 2, 4)] == [[0], [0, 1], [0, 1, 2, 3]]
    assert all(picks[n].crosses_numa is False for n in (1, 2, 4))
    assert picks[8].gpus == list(range(8)) and picks[8].crosses_numa and picks[8].numa_nodes == [0, 1]


def test_gpus_for_tp_when_node_0_is_short():
    """GPUs 0-2 on node 0, 3-7 on node 1: TP4 goes to node 1, TP8 spans both."""
    doc = json.loads((TFIX / "synthetic_8gpu_2numa_pcie.json").read_text())
    for g in doc["gpus"]:
        g["numa_node"] = 0 if g["index"] < 3 else 1
    from gpubox.hwtune.topology import from_nvml_doc

    topo = from_nvml_doc(doc)
    assert gpus_for_tp(topo, 4).gpus == [3, 4, 5, 6] and gpus_for_tp(topo, 4).crosses_numa is False
    assert gpus_for_tp(topo, 2).gpus == [0, 1]
    assert gpus_for_tp(topo, 8).numa_nodes == [1, 0]


def test_gpus_input_json_round_trip(capsys, tmp_path):
    rc, out, _ = gpubox(capsys, "gpus", "--input", str(TFIX / "synthetic_8gpu_h200_hgx.json"), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert len(doc["links"]["nvlink"]) == 28 and doc["links"]["pcie"] == []
    assert doc["numa_nodes"] == {"None": list(range(8))}
    assert [t["tp"] for t in doc["tp"]] == [1, 2, 4, 8]
    assert all(t["crosses_numa"] is None and "unknown" in t["reason"] for t in doc["tp"])
    saved = tmp_path / "topology.json"
    saved.write_text(out)
    rc, out2, _ = gpubox(capsys, "gpus", "--input", str(saved), "--json", "--tp", "4")
    again = json.loads(out2)
    assert rc == 0 and again["gpus"] == doc["gpus"] and again["pairs"] == doc["pairs"]
    assert again["tp"][0]["gpus"] == [0, 1, 2, 3]


def test_gpus_table_counts_links(capsys):
    rc, out, _ = gpubox(capsys, "gpus", "--input", str(TFIX / "synthetic_8gpu_2numa_pcie.json"))
    assert rc == 0 and "pairs: 0 NVLink, 28 PCIe only" in out and "TP4: 0,1,2,3" in out


def test_gpus_bad_arguments(capsys, tmp_path):
    rc, _, err = gpubox(capsys, "gpus")
    assert rc == 2 and "give exactly one of BOX, --local or --input" in err
    rc, _, err = gpubox(capsys, "gpus", "ct200", "--local")
    assert rc == 2
    bad = tmp_path / "x.json"
    bad.write_text('{"gpus": [{"name": "no index"}]}')
    rc, _, err = gpubox(capsys, "gpus", "--input", str(bad))
    assert rc == 2 and "no list of GPUs with an index" in err


def _fake_pynvml_dir(tmp_path, doc):
    spec = importlib.util.spec_from_file_location("topo_tests", ROOT / "tests" / "test_hwtune_topology.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = tmp_path / "fakenvml"
    d.mkdir()
    (d / "pynvml.py").write_text(mod.FAKE_PYNVML)
    (d / "doc.json").write_text(json.dumps(doc if doc is not None else mod.eight_gpu_doc(nvlink=True)))
    return d


def test_gpus_local_reads_nvml_in_process(tmp_path):
    """`gpubox gpus --local` through the real CLI in a real process, over the pynvml-shaped
    module of the topology tests (NVML cannot run without a GPU): NVLink pairs, NUMA, TP picks."""
    d = _fake_pynvml_dir(tmp_path, None)
    env = {**os.environ, "PYTHONPATH": f"{d}:{ROOT}", "FAKE_NVML_DOC": str(d / "doc.json")}
    r = subprocess.run(
        [sys.executable, "-m", "gpubox.cli", "gpus", "--local", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"] == "nvml" and len(doc["gpus"]) == 8 and "(local)" in doc["notes"][0]
    assert doc["links"]["nvlink"] == ["0-1", "2-3", "4-5", "6-7"]
    assert doc["pairs"]["3-4"]["level"] == "SYS"
    tp = {t["tp"]: t for t in doc["tp"]}
    assert tp[4]["gpus"] == [0, 1, 2, 3] and tp[8]["crosses_numa"] is True and tp[1]["gpus"] == [0]


def test_gpus_local_without_nvml_says_why(capsys):
    pytest.importorskip("pynvml")
    from gpubox.hwtune.topology import discover_local

    if discover_local().gpus:
        pytest.skip("this machine has GPUs")
    rc, out, _ = gpubox(capsys, "gpus", "--local", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["gpus"] == [] and "NVML not available" in doc["notes"][0]


# -- the run script --------------------------------------------------------------------------------
def test_multigpu_run_script_end_to_end_without_gpus(tmp_path):
    """The script the lead passes to the device, run here: every output file is written and
    parses; with no GPU every section says why it was skipped; it takes seconds."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "ROUNDS": "1", "PROFILES": "pcie-2numa"}
    env.pop("NCCL_NVLS_ENABLE", None)
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "multigpu_run.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "nccl_compare_pcie-2numa.json",
        "probe.json",
        "probe_report.json",
        "run.log",
        "system.txt",
        "topology.json",
    ]
    assert len(names) <= 8  # the device returns at most 8 files
    for n in names:
        if n.endswith(".json"):
            json.loads((out / n).read_text())
    system = (out / "system.txt").read_text()
    assert "NCCL_NVLS_ENABLE=0" in system and "NVSHMEM_DISABLE_NVLS=1" in system
    probe = json.loads((out / "probe.json").read_text())
    assert probe["schema"] == "gpubox.probe/1" and probe["env"]["NCCL_NVLS_ENABLE"] == "0"
    cmp_ = json.loads((out / "nccl_compare_pcie-2numa.json").read_text())
    assert cmp_["schema"] == "gpubox.nccl-compare/1" and cmp_["safety_env"]["NCCL_NVLS_ENABLE"] == "0"
    log = (out / "run.log").read_text()
    assert "end topology rc=" in log and "end probe rc=0" in log and "done in" in log


def test_nvswitch_links_make_every_pair_nvlink(tmp_path, monkeypatch):
    """HGX boards: each GPU's 18 NVLinks go to NVSwitches, not to another GPU. The pairs are
    NVLink-connected when NVML's P2P status over NVLink says OK; without that answer they stay PCIe."""
    spec = importlib.util.spec_from_file_location("topo_tests2", ROOT / "tests" / "test_hwtune_topology.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = mod.eight_gpu_doc(nvlink=False)
    switches = [f"00000000:{0x05 + k:02X}:00.0" for k in range(4)]  # 4 NVSwitch chips
    for i, d in enumerate(doc["devices"]):
        d.update(name="NVIDIA H200", numa="NotSupported", nvlinks=[switches[k % 4] for k in range(18)])
    doc["p2p_nvlink_ok"] = [0, 1, 2, 3, 4, 5]  # GPUs 6, 7: fabric not up
    src = mod.FAKE_PYNVML + (
        "\nNVML_P2P_CAPS_INDEX_NVLINK = 2\nNVML_P2P_STATUS_OK = 0\n"
        "def nvmlDeviceGetP2PStatus(a, b, idx):\n"
        "    ok = _d()['p2p_nvlink_ok']\n"
        "    return 0 if idx == 2 and a in ok and b in ok else 5\n"
    )
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    (tmp_path / "pynvml_sw.py").write_text(src)
    monkeypatch.setenv("FAKE_NVML_DOC", str(tmp_path / "doc.json"))
    spec = importlib.util.spec_from_file_location("pynvml_sw", tmp_path / "pynvml_sw.py")
    nv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nv)
    from gpubox.hwtune.topology import from_nvml

    topo = from_nvml(nv, read_numa=lambda bus: None)
    assert topo.relation(0, 5) == {"relation": "NV18", "level": "SYS", "nvlinks": 18, "via": "NVSwitch"}
    assert topo.relation(5, 6)["relation"] == "PCIe" and topo.relation(6, 7)["nvlinks"] == 0
    assert sum(p["nvlinks"] > 0 for p in topo.pairs.values()) == 15  # C(6, 2)


# -- a figure beyond the PCIe link (issue 38) ------------------------------------------------------
def without_topology(doc):
    """The document as a probe without NVLink facts records it (before issue 18's fields): no
    nvlink, numa or fabric per GPU; everything measured stays as recorded."""
    for g in doc["nvml"]["gpus"]:
        for k in ("nvlink", "numa", "fabric"):
            g.pop(k, None)
    return doc


def recorded_h200x2():
    return without_topology(load("h200x2_nvswitch/probe.json"))


def test_nvlink_p2p_without_topology_facts_is_judged_as_nvlink_not_as_a_pcie_ratio():
    """Recorded on 2x H200 behind an NVSwitch: P2P 382-384 GB/s, all-reduce busbw 297 GB/s, PCIe
    Gen5 x16 (63 GB/s). Without NVLink facts this was "606% of PCIe" and ok; the figure proves
    another link, so it is judged against the H200's NVLink (450 GB/s per direction)."""
    doc = recorded_h200x2()
    c = by_name(decide(doc))
    rows = [c["p2p gpu0->gpu1"], c["p2p gpu1->gpu0"], c["allreduce 0,1"]]
    for row in rows:
        assert (
            row.status == "ok"
            and "NVLink/NVSwitch" in row.detail
            and "beyond what the PCIe path carries" in row.detail
        )
        assert row.evidence["reference"] == 450.0 and row.evidence["pcie_gbps"] == 63.0
        assert row.evidence["pct"] <= 100 and row.evidence["beyond_pcie"] is True
    figures = {p["name"] + str(p.get("src")): p for p in doc["bandwidth"]["probes"]}
    assert c["p2p gpu0->gpu1"].evidence["pct"] == round(100 * figures["p2p0"]["gbps"] / 450.0, 1)
    assert not any("% of PCIe" in x.detail or "% of link" in x.detail for x in rows)


def test_a_slow_nvlink_pair_beyond_pcie_is_drift():
    doc = recorded_h200x2()
    for p in doc["bandwidth"]["probes"]:
        if p["name"] == "p2p":
            p["gbps"] = 120.0  # beyond PCIe's 63, 27% of NVLink's 450: a link down or trained slower
    row = by_name(decide(doc))["p2p gpu0->gpu1"]
    assert row.status == "drift" and row.detail.startswith("P2P slow: 120.0 GB/s = 27% of NVLink/NVSwitch")
    assert "NVLink down" in row.cause


def test_beyond_pcie_on_a_model_without_a_known_nvlink_figure_is_not_judged():
    doc = recorded_h200x2()
    for g in doc["nvml"]["gpus"]:
        g["name"] = "NVIDIA Example Accelerator"
    row = by_name(decide(doc))["p2p gpu0->gpu1"]
    assert row.status == "skipped" and "did not cross that link (NVLink/NVSwitch" in row.detail
    assert "NVIDIA Example Accelerator" in row.detail and "%" not in row.detail


def test_a_set_of_a_larger_box_without_topology_scales_the_minimum_by_the_mesh_share():
    """4x H200 without NVLink facts: a pair is held to 1/3 of the minimum (a full mesh gives a
    pair 1/3 of each GPU's NVLink), the whole box to all of it."""
    doc = without_topology(load("synthetic_4gpu_h200_nvlink.json"))
    c = by_name(decide(doc))
    pair, box = c["allreduce 0,1"], c["allreduce 0,1,2,3"]
    assert pair.evidence["min_pct"] == round(30 * 1 / 3, 1) and box.evidence["min_pct"] == 30
    assert pair.evidence["reference"] == box.evidence["reference"] == 450.0
    assert "1/3 of it" in pair.detail and "1/3" not in box.detail


def test_pcie_pairs_within_the_pcie_rate_are_judged_against_pcie_as_before():
    c = by_name(decide(load("synthetic_8gpu_pcie.json")))
    row = c["p2p gpu0->gpu1"]
    assert "beyond_pcie" not in row.evidence and "NVLink" not in row.detail


def test_grace_host_copies_beyond_pcie_are_judged_against_nvlink_c2c():
    doc = load("h200_real.json")
    h2d = next(p for p in doc["bandwidth"]["probes"] if p["name"] == "h2d")
    h2d["gbps"] = 400.0  # beyond Gen5 x16: not over PCIe
    doc["nvml"]["gpus"][0]["name"] = "NVIDIA GH200 480GB"
    row = by_name(decide(doc))["gpu0 h2d"]
    assert row.status == "ok" and row.evidence["reference"] == 450.0 and "NVLink-C2C" in row.detail
