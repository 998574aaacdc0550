"""Issue 19 pieces outside the client: launcher readiness, TP bounds, bench run flags, verdict tags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpubox.bench.launcher import LaunchError, Server, free_port
from gpubox.bench.profiles import PROFILES, apply_overrides, plan
from gpubox.bench.runner import bounded_tps
from gpubox.errors import GpuboxError
from tests.clirun import gpubox
from tests.hostile.server import hostile

ROOT = Path(__file__).resolve().parents[1]


def _server(tmp_path, *kv: str) -> Server:
    port = free_port()
    return Server(
        [sys.executable, "-m", "tests.hostile.server", str(port), *kv],
        {"PYTHONPATH": str(ROOT)},
        port=port,
        log_path=tmp_path / "s.log",
        cwd=str(ROOT),
    )


def test_ready_without_health_endpoint(tmp_path):
    """llama-cpp-python has no /health while /v1/models answers: ready, not a 900 s wait."""
    s = _server(tmp_path, "health=absent")
    s.start()
    try:
        assert s.wait_ready(timeout=20) < 20
    finally:
        s.stop()


def test_not_ready_error_names_what_answered(tmp_path):
    s = _server(tmp_path, "health=loading")
    s.start()
    try:
        with pytest.raises(LaunchError, match=r"/health 503, /v1/models 200"):
            s.wait_ready(timeout=3)
    finally:
        s.stop()


@pytest.mark.parametrize(
    "profile,box,want",
    [([1, 4, 8], [1], [1]), ([1, 4, 8], None, [1, 4, 8]), ([4, 8], [1, 4], [4]), ([8], [1], [1])],
)
def test_box_tp_bounds_profile(profile, box, want):
    assert bounded_tps(profile, box) == want


def test_run_flags_shape_the_plan():
    prof = apply_overrides(PROFILES["health"], concurrency=[1, 32], output_len=64, prompt_len=50)
    assert plan(prof) == [
        ("decode", {"output_len": 64}),
        ("concurrency", {"conc": 1, "output_len": 64}),
        ("concurrency", {"conc": 32, "output_len": 64}),
    ]
    assert prof["prompt_tokens"] == 50 and PROFILES["health"]["prompt_tokens"] == 128  # no aliasing
    with pytest.raises(GpuboxError, match="--output-len 0"):
        apply_overrides(PROFILES["health"], output_len=0)


def test_text_output_keeps_verdict_tags(tmp_path, capsys):
    """issue 19 #8: `[failed]` was eaten as rich markup."""
    with hostile(stream="short", short=3) as s:
        rc, out, err = gpubox(
            capsys,
            "bench",
            "run",
            "--url",
            s.url,
            "--output-len",
            "16",
            "--concurrency",
            "2",
            "--prompt-len",
            "8",
            "--out",
            tmp_path / "o",
        )
    assert rc == 1 and "- [failed]" in out and "short answer: 3 of 16" in " ".join(out.split())
