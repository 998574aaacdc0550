"""gpubox's benchmark against a real server nobody here wrote: GuideLLM's mock server (issue 19).

GuideLLM 0.8.1 `mock-server` (sanic) serves /v1/models, /health, /tokenize (`{"text"}` only; its
tokenizer counts each space: 2n-1 tokens for n words) and streamed completions paced by its
`--ttft-ms`/`--itl-ms`. The launcher starts it, waits for readiness, gpubox measures, the launcher
tears it down. Skipped where GuideLLM is not installed, except in CI (.ci/run installs it into its
own venv and sets GPUBOX_REQUIRE_REAL_SERVERS=1, so a missing server is a failure there).
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from gpubox.bench import results
from gpubox.bench.launcher import Server
from gpubox.bench.runner import run_url

TTFT_MS, ITL_MS = 60.0, 12.0


def _guidellm() -> str:
    exe = os.environ.get("GPUBOX_GUIDELLM") or shutil.which("guidellm")
    if not exe or not os.access(exe, os.X_OK):
        if os.environ.get("GPUBOX_REQUIRE_REAL_SERVERS"):
            pytest.fail("GuideLLM is required here (GPUBOX_REQUIRE_REAL_SERVERS) but not installed")
        pytest.skip("GuideLLM not installed (set GPUBOX_GUIDELLM=/path/to/guidellm)")
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mock_server(tmp_path):
    port = _free_port()
    argv = [
        _guidellm(),
        "mock-server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        "tiny-mock",
        "--ttft-ms",
        str(TTFT_MS),
        "--itl-ms",
        str(ITL_MS),
    ]
    srv = Server(argv, {}, host="127.0.0.1", port=port, log_path=tmp_path / "guidellm.log")
    srv.start()
    try:
        srv.wait_ready(120)
        yield srv
    finally:
        srv.stop()
    assert not srv.alive()


def test_gpubox_measures_guidellm_mock_server(mock_server, tmp_path):
    prof = {
        "warmup": 1,
        "repetitions": 2,
        "prompt_tokens": 64,
        "workloads": [
            {"kind": "decode", "output_lens": [48]},
            {"kind": "concurrency", "concurrency": [4], "output_len": 48},
        ],
    }
    doc = run_url(
        mock_server.url, profile="p", settings={"profiles": {"p": prof}}, out_dir=tmp_path / "out", timeout=30
    )
    assert results.validate(doc) == []
    assert [m["status"] for m in doc["measurements"]] == ["ok", "ok"], [
        m["reason"] for m in doc["measurements"]
    ]
    learned = doc["servers"][0]["client"]
    assert learned["prompt_sizing"] == "server /tokenize (text shape)", learned
    for m in doc["measurements"]:
        for smp in m["samples"]:
            assert smp["tokens_source"] == "usage" and smp["output_tokens"] == 48
            assert smp["prompt_tokens"] == 64  # sized by its /tokenize, confirmed by its usage
        # the mock sleeps at least what it was told; a loaded CI machine only adds to it
        assert m["ttft_s"]["p50"] * 1000 >= TTFT_MS * 0.95, m["ttft_s"]
        assert ITL_MS * 0.95 <= m["tpot_ms"]["p50"] <= ITL_MS * 2.5, m["tpot_ms"]
    assert doc["box"].startswith("url-127.0.0.1-") and "tiny-mock" in doc["box"]
