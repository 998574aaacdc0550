"""Verdict logic on a recorded result (a health run against the simulated box, speed x20) and
mutations of it; metrics parsing of vLLM's /metrics text."""

import copy
import json
from pathlib import Path

import pytest

from gpubox.bench import metrics, results
from gpubox.bench.verdict import decide, exit_code

DOC = json.loads((Path(__file__).parent / "data" / "bench_result_sim.json").read_text())
SPEED = DOC["sim_speed"]
EXPECT = {
    "tolerance": 0.15,
    "min_speedup_over_auto": 3.0,
    "tok_s": {
        "tp1": {"auto": 26.6 * SPEED, "ddtree:15": 173.4 * SPEED},
        "tp4": {"auto": 37.8 * SPEED, "ddtree:15": 281.1 * SPEED},
        "tp8": {"auto": 37.6 * SPEED, "ddtree:15": 263.9 * SPEED},
    },
}


def doc():
    return copy.deepcopy(DOC)


def m(d, key):
    return next(x for x in d["measurements"] if x["key"] == key)


def test_recorded_result_is_valid_and_healthy():
    assert results.validate(DOC) == []
    v = decide(doc(), EXPECT)
    assert v == {"status": "healthy", "reasons": []}
    assert exit_code(v) == 0


def test_below_expectation_is_degraded_with_numbers():
    d = doc()
    m(d, "tp8/ddtree:15/decode/out1024")["tok_s"] = 230.1 * SPEED
    v = decide(d, {**EXPECT, "tolerance": 0.10})
    assert v["status"] == "degraded" and exit_code(v) == 1
    (r,) = v["reasons"]
    assert r["key"] == "tp8/ddtree:15/decode/out1024"
    assert "12.8% below the expected" in r["message"] and r["expected"] == pytest.approx(263.9 * SPEED)


def test_within_tolerance_is_healthy():
    d = doc()
    m(d, "tp8/ddtree:15/decode/out1024")["tok_s"] = 263.9 * SPEED * 0.9
    assert decide(d, EXPECT)["status"] == "healthy"


def test_speedup_over_auto():
    d = doc()
    m(d, "tp1/auto/decode/out1024")["tok_s"] = 60 * SPEED  # ddtree now only ~2.9x
    v = decide(d, {"min_speedup_over_auto": 3.0})
    sp = [r for r in v["reasons"] if "x autoregressive" in r["message"]]
    assert [r["key"] for r in sp] == ["tp1/ddtree:15/decode/out1024"]


def test_acceptance_drift_across_tp_is_flagged():
    d = doc()
    m(d, "tp8/ddtree:15/decode/out1024")["acceptance"]["mean_length"] = 4.1
    v = decide(d, {})
    assert v["status"] == "degraded"
    assert any("drifts across TP sizes" in r["message"] and "TP8 4.10" in r["message"] for r in v["reasons"])


def test_tp_scaling_inversion_is_flagged():
    d = doc()
    one = m(d, "tp1/ddtree:15/decode/out1024")["tok_s"]
    m(d, "tp4/ddtree:15/decode/out1024")["tok_s"] = one * 0.6
    v = decide(d, {})
    assert any(r["message"].startswith("TP scaling inverts for ddtree:15: TP4") for r in v["reasons"])


def test_history_baseline_degrades_and_absent_history_is_ignored():
    d = doc()
    key = "tp4/ddtree:15/concurrency/c8"
    agg = m(d, key)["aggregate_tok_s"]
    v = decide(d, {}, baseline=lambda k: agg * 1.5 if k == key else None)
    assert [r["key"] for r in v["reasons"]] == [key]
    assert "recent median" in v["reasons"][0]["message"]
    assert decide(d, {}, baseline=lambda k: None)["status"] == "healthy"


def test_any_request_error_or_server_failure_fails():
    d = doc()
    x = m(d, "tp4/auto/concurrency/c8")
    x.update(
        status="failed",
        reason="1 of 8 requests failed: HTTP 500: boom",
        tok_s=None,
        aggregate_tok_s=None,
        ttft_s=None,
        tpot_ms=None,
    )
    v = decide(d, EXPECT)
    assert v["status"] == "failed"
    assert "HTTP 500: boom" in v["reasons"][0]["message"]
    d2 = doc()
    d2["servers"][0].update(status="failed", error="server exited with status 1 during start-up")
    assert decide(d2, EXPECT)["status"] == "failed"


def test_skipped_is_not_a_problem_but_nothing_measured_is():
    d = doc()
    for x in d["measurements"]:
        x.update(
            status="skipped", reason="too long", tok_s=None, aggregate_tok_s=None, ttft_s=None, tpot_ms=None
        )
    v = decide(d, EXPECT)
    assert v["status"] == "failed" and v["reasons"][0]["message"] == "no measurement completed"


def test_validate_rejects_zero_figures_for_failed():
    d = doc()
    m(d, "tp1/auto/decode/out1024").update(status="failed", reason="x", tok_s=0.0)
    assert any("must be null, never zero" in e for e in results.validate(d))


VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="q"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="q"} 100.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="q"} 3000.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="q"} 1100.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="q",position="0"} 180.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="q",position="1"} 150.0
"""


def test_metrics_parse_and_acceptance_deltas():
    before = metrics.parse(
        VLLM_METRICS.replace("1100.0", "500.0")
        .replace("} 100.0", "} 50.0")
        .replace("3000.0", "1500.0")
        .replace("180.0", "90.0")
        .replace("150.0", "70.0")
    )
    after = metrics.parse(VLLM_METRICS)
    assert after["num_drafts"] == 200 and after["per_pos"] == [180.0, 150.0]
    acc = metrics.acceptance(before, after)
    assert acc["mean_length"] == pytest.approx(1 + 600 / 100)
    assert acc["rate"] == pytest.approx(600 / 1500)
    assert acc["per_position"] == [0.9, 0.8]
    assert metrics.parse("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n") is None
    assert metrics.acceptance(None, after) is None and metrics.acceptance(after, after) is None
