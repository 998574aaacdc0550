"""Measurement quality of gpubox's benchmark client (issue 6, "Measurement quality").

Against a server whose token timing is known exactly (gpubox's simulator with a fixed decode rate,
a fixed time to first token and no contention between streams), compare what the client measures
with the truth, at 1..64 concurrent streams:

- truth (configured): TTFT = --ttft, TPOT = 1/--rate, tok/s = --rate;
- truth (server-side): the simulator's own timestamps of when it really wrote the first and the
  last token of each request (/sim/truth). Client and simulator run on one machine and both read
  CLOCK_MONOTONIC (time.perf_counter), so "true TTFT" = server's first write - client's send, and
  the client's error is only what the client adds (receiving, parsing, scheduling). The gap
  between the configured and the server-side figures is the simulator's own lateness (accepting
  connections, pacing) on this busy shared 2-core machine, shown separately.

Then the client's CPU cost: a run streaming ~2,000 tokens/s (one token per SSE chunk, the worst
case) with the client's own CPU time from resource.getrusage (user + system of this process only;
the server is a separate process).

If GuideLLM is installed in a throwaway venv (GUIDELLM=/path/to/guidellm), it is run on the same
server for a side-by-side TTFT/TPOT figure.

    python benchmarks/client_accuracy.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import Client, Request, run_concurrent  # noqa: E402
from bench.launcher import Server, free_port  # noqa: E402

TTFT = 0.050
TOTAL_RATE = 2000.0  # tokens/s across all streams
OUT = 256


def start(rate: float, tmp: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "bench.simserver", "--port", str(port), "--rate", str(rate), "--ttft", str(TTFT),
            "--no-contention", "--startup-s", "0", "--max-model-len", "100000"]
    s = Server(argv, {}, port=port, log_path=tmp / f"sim-{port}.log")
    s.start()
    s.wait_ready(20)
    return s


def rel(a: float, b: float) -> float:
    return abs(a - b) / b * 100


async def measure(url: str, conc: int, out: int):
    async with Client(url, timeout=30) as c:
        await c.stream(Request(8, prompt="warm up"))
        before = len(httpx.get(url + "/sim/truth").json())
        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        samples, wall = await run_concurrent(c, [Request(out, prompt="a b c d") for _ in range(conc)], conc)
        ru1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        truth = httpx.get(url + "/sim/truth").json()[before:]
    cpu = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) / (t1 - t0) * 100
    return samples, truth, wall, cpu


def guidellm_side_by_side(url: str, rate: float) -> str:
    exe = os.environ.get("GUIDELLM") or shutil.which("guidellm")
    if not exe:
        return "GuideLLM: not installed (set GUIDELLM=/path/to/guidellm); skipped"
    with tempfile.TemporaryDirectory() as d:
        outp = Path(d) / "g.json"
        cmd = [exe, "benchmark", "--target", url, "--rate-type", "synchronous", "--max-requests", "5",
               "--data", f"prompt_tokens=16,output_tokens={OUT}", "--output-path", str(outp)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not outp.exists():
            return f"GuideLLM: failed rc={r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
        return f"GuideLLM output: {outp.read_text()[:2000]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer concurrency levels")
    a = ap.parse_args()
    levels = [1, 8, 64] if a.quick else [1, 2, 4, 8, 16, 32, 64]
    tmp = Path(tempfile.mkdtemp(prefix="gpubox-acc-"))
    worst = 0.0
    print(f"client accuracy vs known timing: TTFT {TTFT * 1000:.0f} ms, {TOTAL_RATE:.0f} tok/s spread over C streams, "
          f"{OUT} output tokens, 1 token per chunk")
    print(f"{'C':>3} {'tok/s cfg':>9} {'srv':>8} {'client':>8} {'err%':>5} | {'TPOT srv ms':>11} {'client':>8} {'err%':>5} | "
          f"{'TTFT true ms':>12} {'client':>8} {'err%':>5} | {'sim late ms':>11} {'client CPU%':>11}")
    for conc in levels:
        rate = min(TOTAL_RATE / conc, 500.0)
        s = start(rate, tmp)
        try:
            samples, truth, wall, cpu = asyncio.run(measure(s.url, conc, OUT))
        finally:
            s.stop()
        bad = [x.error for x in samples if not x.ok]
        if bad:
            print(f"{conc:>3} FAILED: {bad[0]}")
            return 1
        sends = sorted(x.started for x in samples)
        firsts = sorted(t["t_first"] for t in truth)
        true_ttft = statistics.median(f - c for f, c in zip(firsts, sends)) * 1000
        ttft = statistics.median(x.ttft_s for x in samples) * 1000
        srv_tpot = statistics.median((t["t_last"] - t["t_first"]) / (t["output_tokens"] - 1) for t in truth) * 1000
        tpot = statistics.median(x.tpot_s for x in samples) * 1000
        tok = statistics.median(x.tok_s for x in samples)
        late = statistics.median(t["ttft_s"] for t in truth) * 1000 - TTFT * 1000 + \
            statistics.median(t["t_recv"] - c for t, c in zip(sorted(truth, key=lambda t: t["t_recv"]), sends)) * 1000
        e_tok, e_tpot, e_ttft = rel(tok, 1000 / srv_tpot), rel(tpot, srv_tpot), rel(ttft, true_ttft)
        worst = max(worst, e_tok, e_tpot, e_ttft)
        print(f"{conc:>3} {rate:>9.1f} {1000 / srv_tpot:>8.2f} {tok:>8.2f} {e_tok:>5.2f} | {srv_tpot:>11.3f} {tpot:>8.3f} "
              f"{e_tpot:>5.2f} | {true_ttft:>12.2f} {ttft:>8.2f} {e_ttft:>5.2f} | {late:>11.1f} {cpu:>11.1f}")
    print(f"worst client error vs the server's true timing: {worst:.2f}% (goal: within 2%)")

    # client CPU at 2,000 streamed tokens/s, one token per chunk, for several seconds
    conc = 8
    s = start(TOTAL_RATE / conc, tmp)
    try:
        samples, truth, wall, cpu = asyncio.run(measure(s.url, conc, 1500))
        print(f"client CPU at {sum(x.output_tokens for x in samples) / wall:.0f} streamed tok/s "
              f"({conc} streams, 1 token/chunk, {wall:.1f} s): {cpu:.1f}% of one core (goal: under 20%)")
        print(guidellm_side_by_side(s.url, TOTAL_RATE / conc))
    finally:
        s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
