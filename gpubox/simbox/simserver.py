"""SIMULATOR of a vLLM-style OpenAI-compatible inference server (no GPU, no model).

This is NOT a real inference server. It exists so that tests and the demo can drive the real
launcher, client, metrics scraper and verdict against a real HTTP server process that behaves like
vLLM serving Qwen3.6-27B with DFlash/DDTree speculative decoding on the seed box:

- endpoints: /health, /v1/models, /tokenize, /metrics, /v1/completions, /v1/chat/completions
  (SSE streaming, `stream_options.include_usage` final usage chunk, `data: [DONE]`);
- HTTP 400 in vLLM's error JSON shape when prompt + max_tokens exceeds max_model_len
  (docs/facts.md "Serving benchmarks": the seed's 25k-context failure);
- decode rates from the seed's reference figures (docs/facts.md "Reference figures"), with TP, output-length,
  concurrency and long-context effects; speculative methods emit several tokens per SSE chunk and
  count vllm:spec_decode_* on /metrics like vLLM does;
- `--speed K` multiplies every simulated rate (and divides every delay) so tests finish quickly.
  Tokens really are paced in time: a client measures K x the seed's tok/s, and results record
  "simulated": true and "sim_speed": K so reports can divide it back out;
- the box's tuning state (`--host-root`/`--root`): at start it reads the same files gpubox tunes
  (the GPUs' PCIe MaxReadReq in sysfs config space, kernel.numa_balancing, the NCCL variables its
  own environment and NCCL's config files give it) and slows decoding the way the untuned seed box
  was slower (see "tuning state" below); `/sim/state` and the log say what it saw;
- failure switches for tests: --fail-start, --die-after N, --hang-after N, --error-status CODE,
  --close-after N.

Tokenizer: one whitespace-separated word is one token (exact and cheap, so /tokenize-sized prompts
are exact). Stdlib asyncio only: no web framework dependency.

This module is the entry (options, start-up, serving); the parts, by role: simserver_routes.py
(HTTP and routes), simserver_generation.py (pacing, speculative decoding, chunks),
simserver_rates.py (the performance model), simserver_tuning.py (the tuning state it reads),
simserver_truth.py (the per-request truth records).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from .simserver_generation import Sim
from .simserver_routes import Handler
from .simserver_tuning import nccl_fatal, nccl_settings


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpubox.simbox.simserver",
        description="gpubox SIMULATOR of a vLLM OpenAI-compatible server (no GPU).",
    )
    p.add_argument("--model", default="/dev/shm/Qwen3.6-27B")
    p.add_argument("--served-model-name", dest="served_name", default=None)
    p.add_argument(
        "--models-list",
        choices=["full", "empty"],
        default="full",
        help="empty: /v1/models lists nothing and only the named model is served (transformers serve 5.17)",
    )
    p.add_argument(
        "--truth-file", default=None, help="append each request's /sim/truth record here (JSON lines)"
    )
    p.add_argument(
        "--loading-requests", type=int, default=0, help="answer the first N generation requests 503 (loading)"
    )
    p.add_argument("--drafter", default="")
    p.add_argument("--method", choices=["auto", "linear", "ddtree"], default="auto")
    p.add_argument("--budget", type=int, default=15)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--speed", type=float, default=1.0, help="multiply every simulated rate by this")
    p.add_argument(
        "--rate", type=float, default=None, help="fixed decode tok/s (before --speed): exact timing"
    )
    p.add_argument("--ttft", type=float, default=None, help="fixed time to first token, s (before --speed)")
    p.add_argument("--no-contention", action="store_true", help="concurrent streams do not slow each other")
    p.add_argument("--accept-scale", type=float, default=1.0, help="scale mean acceptance length (tests)")
    p.add_argument("--startup-s", type=float, default=0.2, help="simulated model load time before listening")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--host-root",
        default=None,
        help="root of the (simulated) host whose tuning to model: sysfs PCI config, numa_balancing",
    )
    p.add_argument("--root", default=None, help="the server's own root, for /etc/nccl.conf and ~/.nccl.conf")
    p.add_argument(
        "--fail-start", action="store_true", help="exit 1 during start-up like a CUDA init failure"
    )
    p.add_argument("--die-after", type=int, default=None, help="crash after N generated tokens in total")
    p.add_argument("--hang-after", type=int, default=None, help="stop sending after N tokens of a request")
    p.add_argument("--error-status", type=int, default=None, help="answer completions with this HTTP status")
    p.add_argument("--close-after", type=int, default=None, help="drop each stream after N tokens")
    p.add_argument("--spawn-child", action="store_true", help="start a worker child like vLLM's EngineCore")
    a = p.parse_args(argv)
    a.served_name = a.served_name or a.model
    if a.method == "auto":
        a.budget = 0
    return a


async def _serve(a: argparse.Namespace) -> None:
    sim = Sim(a)
    print(f"INFO gpubox SIMULATED tuning state: {sim.tuning.summary()}", flush=True)
    for note in sim.tuning.notes:
        print(f"WARNING gpubox SIMULATED tuning state: {note}", flush=True)
    server = await asyncio.start_server(Handler(sim).conn, a.host, a.port, limit=1 << 22, backlog=256)
    print(f"INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)", flush=True)
    async with server:
        await server.serve_forever()


def main(argv=None) -> int:
    a = parse(argv)
    print(
        f"INFO gpubox SIMULATED vLLM server: model={a.model} method={a.method} budget={a.budget} "
        f"tp={a.tp} max_model_len={a.max_model_len} speed={a.speed}",
        flush=True,
    )
    child = None
    if a.spawn_child:  # a grandchild process, like vLLM's EngineCore/worker processes
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"INFO EngineCore worker pid={child.pid}", flush=True)
    time.sleep(a.startup_s / max(a.speed, 1.0))
    if a.fail_start:
        print(
            "ERROR RuntimeError: CUDA error: unknown error (simulated start-up failure)\n"
            "ERROR Engine core initialization failed. See root cause above.",
            flush=True,
        )
        return 1
    if a.tp > 1 and a.host_root:  # NCCL initialises communicators only with more than one rank
        fatal = nccl_fatal(nccl_settings(dict(os.environ), Path(a.root) if a.root else None))
        if fatal:
            print(
                f"ERROR NCCL WARN {fatal} (simulated)\nERROR RuntimeError: NCCL error: invalid usage "
                "(run with NCCL_DEBUG=WARN for details)\n"
                "ERROR Engine core initialization failed. See root cause above.",
                flush=True,
            )
            return 1
    try:
        asyncio.run(_serve(a))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
