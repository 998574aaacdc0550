"""probe_verdict on output recorded from a real H200 (tests/fixtures/probe/h200_real.json) and on
copies of it changed the way a degraded box would read."""

import copy
import json
from pathlib import Path

import pytest

from gpubox.errors import GpuboxError
from gpubox.hwtune import probe_verdict as pv
from gpubox.steps import DRIFT, FAILED, OK, SKIPPED

FIX = Path(__file__).parent / "fixtures" / "probe"


@pytest.fixture(scope="module")
def real():
    return json.loads((FIX / "h200_real.json").read_text())


def by_name(checks):
    return {c.name: c for c in checks}


def probe_of(doc, name):
    return next(p for p in doc["bandwidth"]["probes"] if p["name"] == name)


def test_real_h200_is_healthy_and_figures_match_the_recording(real):
    checks = by_name(pv.decide(real))
    assert {n: c.status for n, c in checks.items()} == {
        "nvml": OK,
        "gpu0 state": OK,
        "gpu0 link": OK,
        "gpu0 memory": OK,
        "gpu0 clocks": OK,
        "gpu0 h2d": OK,
        "gpu0 d2h": OK,
        "gpu0 d2d": OK,
        "allreduce 0": SKIPPED,
        "xid": OK,
    }
    h2d = probe_of(real, "h2d")["gbps"]
    assert checks["gpu0 h2d"].evidence["reference"] == 63.0  # Gen5 x16
    assert checks["gpu0 h2d"].evidence["pct"] == round(100 * h2d / 63.0, 1)
    d2d = probe_of(real, "d2d")["gbps"]
    assert checks["gpu0 d2d"].evidence["reference"] == 4800.0  # H200 spec 4.8 TB/s
    assert checks["gpu0 d2d"].evidence["pct"] == round(100 * d2d / 4800.0, 1)
    assert "under load" in checks["gpu0 link"].detail
    rep = pv.report(real, box="h200", host="h200")
    assert rep.ok and rep.exit_code == 0
    assert rep.extra["gpus"][0]["bus_id"] == "0000:00:06.0"
    assert json.dumps(rep.extra["probe"]) == json.dumps(real)  # the document as recorded, key for key


def test_recorded_quick_and_nvml_only_runs_are_healthy():
    for f in ("h200_real_quick.json", "h200_real_nvml_only.json"):
        doc = json.loads((FIX / f).read_text())
        assert pv.report(doc).ok, f
    only = by_name(pv.decide(json.loads((FIX / "h200_real_nvml_only.json").read_text())))
    assert only["bandwidth"].status == SKIPPED and "--no-bandwidth" in only["bandwidth"].detail


def test_link_trained_x8_under_load_is_drift(real):
    doc = copy.deepcopy(real)
    probe_of(doc, "h2d")["link_under_load"]["width"] = 8
    c = by_name(pv.decide(doc))["gpu0 link"]
    assert c.status == DRIFT and "x8 of x16 under load" in c.detail and c.repair


def test_slot_limited_to_gen3_is_drift_and_rates_follow_the_slot(real):
    doc = copy.deepcopy(real)
    g = doc["nvml"]["gpus"][0]
    g["pcie"].update(gen_max=3, gen_current=3)
    probe_of(doc, "h2d")["link_under_load"]["gen"] = 3
    checks = by_name(pv.decide(doc))
    assert checks["gpu0 link"].status == DRIFT
    assert "limits it to Gen3" in checks["gpu0 link"].detail
    assert "below the minimum Gen4" in checks["gpu0 link"].detail
    assert checks["gpu0 h2d"].evidence["reference"] == pv.link_rate(3, 16) == 15.8


def test_gen4_under_load_on_a_gen5_link_is_drift(real):
    doc = copy.deepcopy(real)
    probe_of(doc, "h2d")["link_under_load"]["gen"] = 4
    c = by_name(pv.decide(doc))["gpu0 link"]
    assert c.status == DRIFT and "ran at Gen4 under load, capable of Gen5" in c.detail


def test_idle_downtrained_link_without_load_reading_is_ok(real):
    doc = json.loads((FIX / "h200_real_nvml_only.json").read_text())
    g = doc["nvml"]["gpus"][0]
    g["pcie"]["gen_current"] = 1
    g["clock_event_reasons"] = {"mask": 1, "active": ["gpu_idle"]}
    c = by_name(pv.decide(doc))["gpu0 link"]
    assert c.status == OK and "power" in c.detail
    g["clock_event_reasons"] = {"mask": 0, "active": []}  # busy and still at Gen1: a finding
    assert by_name(pv.decide(doc))["gpu0 link"].status == DRIFT


def test_pcie_replays_over_the_limit(real):
    doc = copy.deepcopy(real)
    doc["nvml"]["gpus"][0]["pcie"]["replay_counter"] = 5000
    assert by_name(pv.decide(doc))["gpu0 link"].status == DRIFT
    assert by_name(pv.decide(doc, pv.limits({"pcie_replay_max": 10000})))["gpu0 link"].status == OK


@pytest.mark.parametrize(
    "change,status,words",
    [
        (
            {"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}},
            DRIFT,
            "row remap pending",
        ),
        (
            {"remapped_rows": {"correctable": 0, "uncorrectable": 9, "pending": False, "failure": True}},
            FAILED,
            "no spare rows",
        ),
        (
            {
                "ecc": {
                    "enabled": True,
                    "volatile_uncorrected": 2,
                    "aggregate_uncorrected": 2,
                    "volatile_corrected": 0,
                }
            },
            DRIFT,
            "2 uncorrectable",
        ),
        (
            {"remapped_rows": None, "retired_pages": {"sbe": 1, "dbe": 1, "pending": True}},
            DRIFT,
            "page retirement pending",
        ),
    ],
)
def test_memory_health(real, change, status, words):
    doc = copy.deepcopy(real)
    doc["nvml"]["gpus"][0].update(change)
    c = by_name(pv.decide(doc))["gpu0 memory"]
    assert c.status == status and words in c.detail and c.repair


def test_thermal_slowdown_under_load_is_drift(real):
    doc = copy.deepcopy(real)
    probe_of(doc, "d2d")["clock_event_reasons_under_load"] = {
        "mask": 0x44,
        "active": ["sw_power_cap", "hw_thermal_slowdown"],
    }
    c = by_name(pv.decide(doc))["gpu0 clocks"]
    assert c.status == DRIFT and "hw_thermal_slowdown" in c.detail and "sw_power_cap" not in c.detail


def test_mig_and_persistence(real):
    doc = copy.deepcopy(real)
    g = doc["nvml"]["gpus"][0]
    g["persistence_mode"] = False
    assert by_name(pv.decide(doc))["gpu0 state"].status == OK
    assert by_name(pv.decide(doc, pv.limits({"require_persistence": True})))["gpu0 state"].status == DRIFT
    g["mig_mode"] = {"current": 1, "pending": 1}
    assert "MIG is on" in by_name(pv.decide(doc))["gpu0 state"].detail


def test_slow_copies_against_thresholds(real):
    doc = copy.deepcopy(real)
    probe_of(doc, "h2d")["gbps"] = 20.0
    c = by_name(pv.decide(doc))["gpu0 h2d"]
    assert c.status == DRIFT and "32% of Gen5 x16" in c.detail
    # the recorded 88% passes the default 70% but not a 90% floor from the inventory
    assert by_name(pv.decide(real, pv.limits({"d2h_min_pct": 90})))["gpu0 d2h"].status == DRIFT


def test_d2d_reference_by_gpu_name(real):
    assert pv.mem_spec_tbs("NVIDIA GH200 480GB") == 4.0  # not read as an H200
    assert pv.mem_spec_tbs("NVIDIA RTX PRO 6000 Blackwell Server Edition") == 1.792
    assert pv.mem_spec_tbs("NVIDIA H100 80GB HBM3") == 3.35
    assert pv.mem_spec_tbs("NVIDIA H100 PCIe") == 2.0
    assert pv.mem_spec_tbs("Some Future GPU") is None
    doc = copy.deepcopy(real)
    doc["nvml"]["gpus"][0]["name"] = "Some Future GPU"
    assert by_name(pv.decide(doc))["gpu0 d2d"].status == SKIPPED
    assert by_name(pv.decide(doc, pv.limits({"mem_bw_tbs": 8.0})))["gpu0 d2d"].status == DRIFT  # 4.28 of 8


def _eight_gpus(real, peer=True, busbw=40.0):
    """The real H200 record widened to 8 GPUs (bus ids 0x10..0x17) with pair and all-reduce figures."""
    doc = copy.deepcopy(real)
    g0 = doc["nvml"]["gpus"][0]
    doc["nvml"]["gpus"] = [
        dict(copy.deepcopy(g0), index=i, bus_id=f"0000:{0x10 + i:02x}:00.0") for i in range(8)
    ]
    doc["bandwidth"]["gpu_bus_ids"] = [f"0000:{0x10 + i:02x}:00.0" for i in range(8)]
    probes = []
    for i in range(8):
        for p in real["bandwidth"]["probes"][:3]:
            probes.append(dict(copy.deepcopy(p), gpu=i, bus_id=f"0000:{0x10 + i:02x}:00.0"))
    probes.append({"name": "p2p", "src": 0, "dst": 1, "status": "ok", "peer_access": peer, "gbps": 50.0})
    probes.append({"name": "p2p", "src": 0, "dst": 4, "status": "ok", "peer_access": True, "gbps": 12.0})
    probes.append(
        {
            "name": "allreduce",
            "gpus": [0, 1, 2, 3],
            "status": "ok",
            "algbw_gbps": busbw / 1.5,
            "busbw_gbps": busbw,
            "busbw_factor": 1.5,
        }
    )
    probes.append(
        {"name": "allreduce", "gpus": [4, 5, 6, 7], "status": "failed", "reason": "RuntimeError: NCCL error"}
    )
    doc["bandwidth"]["probes"] = probes
    return doc


def test_multi_gpu_pairs_and_allreduce(real):
    checks = by_name(pv.decide(_eight_gpus(real), expect_gpus=8))
    assert checks["nvml"].status == OK
    assert checks["p2p gpu0->gpu1"].status == OK  # 50 of 63 GB/s
    assert checks["p2p gpu0->gpu4"].status == DRIFT  # 12 of 63 = 19% < 40%
    assert checks["allreduce 0,1,2,3"].status == OK  # 40 of 63 = 63% >= 30%
    assert checks["allreduce 0,1,2,3"].evidence["pct"] == round(100 * 40 / 63.0, 1)
    assert checks["allreduce 4,5,6,7"].status == FAILED
    no_peer = by_name(pv.decide(_eight_gpus(real, peer=False)))["p2p gpu0->gpu1"]
    assert no_peer.status == DRIFT and "without peer access" in no_peer.detail
    slow = by_name(pv.decide(_eight_gpus(real, busbw=10.0)))["allreduce 0,1,2,3"]
    assert slow.status == DRIFT
    floor = pv.limits({"allreduce_min_busbw_gbps": 100})
    assert by_name(pv.decide(_eight_gpus(real), floor))["allreduce 0,1,2,3"].status == DRIFT


def test_missing_gpu_and_driver_mismatch(real):
    assert by_name(pv.decide(real, expect_gpus=8))["nvml"].status == FAILED
    doc = copy.deepcopy(real)
    doc["nvml"]["kernel_module"] = "575.57.08"
    c = by_name(pv.decide(doc))["nvml"]
    assert c.status == DRIFT and "803" in c.cause


def test_xid_during_probe_fails(real):
    doc = copy.deepcopy(real)
    doc["xid"]["events"] = [{"bus_id": "0000:00:06.0", "xid": 79}]
    c = by_name(pv.decide(doc))["xid"]
    assert c.status == FAILED and "XID 79" in c.detail


def test_no_gpu_document_is_all_skipped():
    doc = {
        "schema": pv.PROBE_SCHEMA,
        "nvml": {"status": "skipped", "reason": "no NVML: libnvidia-ml.so not found"},
        "torch": {"status": "skipped", "reason": "torch not importable"},
        "bandwidth": {"status": "skipped", "reason": "torch not importable"},
        "xid": {"status": "skipped", "reason": "no NVML GPU to watch"},
    }
    checks = pv.decide(doc)
    assert {c.status for c in checks} == {SKIPPED}
    st, detail, _ = pv.summarize(checks)
    assert st == SKIPPED and "no NVML" in detail and "torch" in detail
    assert pv.report(doc).exit_code == 1  # every check skipped: nothing checked, not ok (issue 29)


def test_summarize_worst_wins(real):
    doc = copy.deepcopy(real)
    doc["nvml"]["gpus"][0]["remapped_rows"]["failure"] = True
    probe_of(doc, "h2d")["gbps"] = 10.0
    st, detail, ev = pv.summarize(pv.decide(doc))
    assert st == FAILED and ev["problems"] == ["gpu0 memory", "gpu0 h2d"]
    assert pv.summarize(pv.decide(real))[0] == OK


@pytest.mark.parametrize(
    "raw,words",
    [
        ({"h2d_min": 70}, "unknown key"),
        ({"h2d_min_pct": 150}, "not a percentage"),
        ({"d2d_min_pct": "70"}, "not a percentage"),
        ({"min_link_width": 12}, "not a PCIe width"),
        ({"min_link_gen": 7}, "not a PCIe generation"),
        ({"mem_bw_tbs": -1}, "positive"),
        ({"allreduce_sets": [[0, 1], "2,3"]}, "list of GPU index lists"),
        ([70], "must be a mapping"),
    ],
)
def test_bad_limits_are_one_line_errors(raw, words):
    with pytest.raises(GpuboxError) as ei:
        pv.limits(raw)
    assert words in str(ei.value) and "\n" not in str(ei.value) and ei.value.fix


def test_parse_and_helpers(real):
    assert pv.parse("noise before\n" + json.dumps(real))["schema"] == pv.PROBE_SCHEMA
    with pytest.raises(GpuboxError, match="did not print probe JSON"):
        pv.parse("Traceback (most recent call last):\nImportError: x")
    with pytest.raises(GpuboxError, match="is not a gpubox.probe/1"):
        pv.parse('{"schema": "other"}')
    assert pv.link_rate(4, 16) == 31.5 and pv.link_rate(5, 16) == 63.0 and pv.link_rate(None, 16) is None
    assert pv.tp_sets([1, 4, 8], 8) == [[0, 1, 2, 3], [4, 5, 6, 7], list(range(8))]
    assert pv.tp_sets([1], 1) == [] and pv.tp_sets(None, 8) is None


def test_recorded_cli_report_is_reproduced_from_its_probe_document():
    """`gpubox probe --local --json` on the H200: judging its raw document again gives the same rows."""
    rec = json.loads((FIX / "h200_real_cli_report.json").read_text())
    again = pv.report(rec["probe"], pv.limits(), box=rec["box"], host=rec["box"]).to_dict()
    assert [(s["name"], s["status"], s["detail"]) for s in again["steps"]] == [
        (s["name"], s["status"], s["detail"]) for s in rec["steps"]
    ]
    assert again["gpus"] == rec["gpus"] and rec["ok"] is True


def test_same_gpu_pair_from_the_one_gpu_run_is_not_judged_as_p2p():
    doc = json.loads((FIX / "h200_real_p2p_self.json").read_text())
    c = by_name(pv.decide(doc))["p2p gpu0->gpu0"]
    assert c.status == SKIPPED and "code-path exercise" in c.detail
    assert pv.report(doc).ok
