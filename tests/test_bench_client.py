"""Client and workloads against the simulator as a real process: usage-based token counts,
exact-length prompts, context refusal, and every failure mode (400, 500, early close, hang,
server death) ending as a clear failed measurement, never a hang."""

import asyncio
import time

import httpx
import pytest

from gpubox.bench import metrics
from gpubox.bench.client import Client, ContextTooLong, Request, run_concurrent
from gpubox.bench.profiles import plan, resolve_profile
from gpubox.bench.runner import measure_server
from tests.bench_helpers import simserver

FAST = ("--speed", "50")


def run(coro):
    return asyncio.run(coro)


def test_stream_counts_tokens_from_usage_not_chunks(tmp_path):
    with simserver(tmp_path, "--method", "ddtree", "--tp", "1", *FAST) as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                p = await c.prompt_of(200)
                assert await c.count(p) == 200
                return await c.stream(Request(300, prompt=p))

        smp = run(go())
    assert smp.ok, smp.error
    assert smp.output_tokens == 300 and smp.prompt_tokens == 200
    assert smp.chunks < 150  # several tokens per chunk: chunk counts would be wrong
    assert smp.tokens_per_chunk > 2
    assert smp.tpot_s == pytest.approx((smp.e2e_s - smp.ttft_s) / 299)


def test_ignore_eos_gives_fixed_length_and_chat_thinking(tmp_path):
    with simserver(tmp_path, *FAST) as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                fixed = await c.stream(Request(700, prompt="hello there", ignore_eos=True))
                free = await c.stream(Request(700, prompt="hello there", ignore_eos=False))
                chat = await c.stream(
                    Request(20, messages=[{"role": "user", "content": "hi"}], thinking=True)
                )
                return fixed, free, chat

        fixed, free, chat = run(go())
    assert fixed.output_tokens == 700
    assert free.ok and free.output_tokens < 700  # the server stopped at "EOS"
    assert chat.ok and chat.output_tokens == 20 and chat.prompt_tokens == 3 + 4 + 1


def test_context_too_long_is_refused_before_sending_and_server_400_is_clear(tmp_path):
    with simserver(tmp_path, "--max-model-len", "4096", *FAST) as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                with pytest.raises(ContextTooLong, match="exceeds the server's max_model_len 4096"):
                    await c.check_fits(4000, 256)
                p = await c.prompt_of(4000)
                return await c.stream(Request(256, prompt=p))  # sent anyway: the server's own 400

        smp = run(go())
        truth = __import__("httpx").get(s.url + "/sim/truth").json()
    assert not smp.ok and smp.output_tokens is None
    assert smp.error.startswith("HTTP 400: This model's maximum context length is 4096 tokens")
    assert truth == []  # nothing was generated


def test_http_500_is_a_failed_sample(tmp_path):
    with simserver(tmp_path, "--error-status", "500", *FAST) as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                return await c.stream(Request(10, prompt="x"))

        smp = run(go())
    assert smp.error == "HTTP 500: simulated engine failure"


def test_early_close_is_a_failed_sample(tmp_path):
    with simserver(tmp_path, "--close-after", "5", *FAST) as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                return await c.stream(Request(100, prompt="x"))

        smp = run(go())
    assert not smp.ok
    assert "mid-stream" in smp.error or "ended early" in smp.error
    assert smp.ttft_s is None and smp.output_tokens is None  # never partial figures


def test_hang_becomes_a_timeout_not_a_hang(tmp_path):
    with simserver(tmp_path, "--hang-after", "3", *FAST) as s:

        async def go():
            async with Client(s.url, timeout=0.5) as c:
                return await c.stream(Request(100, prompt="x"))

        t0 = time.monotonic()
        smp = run(go())
    assert time.monotonic() - t0 < 600  # the simulator hangs for 3600 s; the 0.5 s timeout ended it
    assert smp.error.startswith("stream stalled: nothing received for")


def test_server_dying_mid_run_fails_the_rest_clearly(tmp_path):
    prof = resolve_profile(
        "health", {"profiles": {"health": {"repetitions": 2, "warmup": 0, "prompt_tokens": 16}}}
    )
    prof["workloads"] = [
        {"kind": "decode", "output_lens": [256]},
        {"kind": "concurrency", "concurrency": [4], "output_len": 256},
    ]
    with simserver(tmp_path, "--die-after", "300", *FAST) as s:
        ms = run(
            measure_server(
                s.url,
                tp=1,
                label="auto",
                points=plan(prof),
                prof=prof,
                timeout=2,
                alive=s.alive,
                died=lambda: "server died: exited 3",
            )
        )
        assert s.proc.poll() == 3
    assert [m["status"] for m in ms] == ["failed", "failed"]
    assert "requests failed" in ms[0]["reason"] and "server died: exited 3" in ms[0]["reason"]
    assert ms[1]["reason"] == "server died: exited 3"
    assert ms[0]["tok_s"] is None and ms[0]["samples"]  # raw samples kept, figures null


def test_concurrency_and_spec_metrics(tmp_path):
    with simserver(tmp_path, "--method", "ddtree", "--budget", "15", "--tp", "4", "--speed", "5") as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                before = metrics.scrape(s.url)
                reqs = [Request(400, prompt="a b c", extra={"user": f"c{i}"}) for i in range(8)]
                smp, wall = await run_concurrent(c, reqs, 8)
                return smp, wall, metrics.acceptance(before, metrics.scrape(s.url))

        smp, wall, acc = run(go())
        truth = [t for t in httpx.get(s.url + "/sim/truth").json() if str(t.get("user")).startswith("c")]
    assert all(x.ok for x in smp)
    # 8 streams really ran at once, on the server's own clock (no margin on this machine's speed):
    # every request had arrived before the first of them ended
    assert len(truth) == 8 and max(t["t_recv"] for t in truth) < min(t["t_last"] for t in truth)
    # the client's wall time holds all of them: from before the first arrival to after the last token
    span = max(t["t_last"] for t in truth) - min(t["t_recv"] for t in truth)
    assert wall >= span and sum(x.output_tokens for x in smp) == 8 * 400
    assert 5.0 < acc["mean_length"] < 8.0 and len(acc["per_position"]) == 15
    assert acc["per_position"] == sorted(acc["per_position"], reverse=True)


def test_auto_server_has_no_spec_counters(tmp_path):
    with simserver(tmp_path, *FAST) as s:
        assert metrics.scrape(s.url) is None
