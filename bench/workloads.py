"""The workloads that turn client samples into measurements.

Workloads (each with warmup requests and repetitions; median and min/max spread are reported):
- decode: one stream at output lengths 256/1024/2048;
- concurrency: C = 1, 2, 4, 8 streams at once (aggregate tok/s, per-request tok/s, TTFT p50/p99);
- long_context: 25k and 100k prompt tokens, skipped with the reason when max_model_len is smaller
  (docs/facts.md "Serving benchmarks": prompt + max_tokens > max_model_len is an HTTP 400, refuse before sending);
- agentic: a multi-turn chat session with a growing shared prefix (~4k tokens of context).

The profiles that choose these workloads are in bench/profiles.py.
"""

from __future__ import annotations

import statistics
from typing import Any

from . import metrics
from .client import Client, ContextTooLong, Request, Sample, run_concurrent
from .profiles import WARMUP_TOKENS, key_of


# -- statistics ------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    """Percentile with linear interpolation (numpy's default); None for no values."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        return v[0]
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def measurement(
    *,
    tp: int,
    label: str,
    method: str,
    budget: int | None,
    workload: str,
    key_suffix: str,
    output_len: int | None,
    concurrency: int = 1,
    context_tokens: int | None = None,
    samples: list[Sample] | None = None,
    rep_walls: list[float] | None = None,
    acceptance: dict | None = None,
    status: str | None = None,
    reason: str | None = None,
    repetitions: int = 0,
) -> dict[str, Any]:
    """One measurement record (docs/result-schema.md). Failed/skipped ones have null figures."""
    samples = samples or []
    m: dict[str, Any] = {
        "key": f"tp{tp}/{label}/{workload}/{key_suffix}",
        "tp": tp,
        "method": method,
        "budget": budget,
        "label": label,
        "workload": workload,
        "output_len": output_len,
        "concurrency": concurrency,
        "context_tokens": context_tokens,
        "status": status or "ok",
        "reason": reason,
        "repetitions": repetitions,
        "tok_s": None,
        "tok_s_spread": None,
        "aggregate_tok_s": None,
        "ttft_s": None,
        "tpot_ms": None,
        "e2e_s": None,
        "tokens_per_chunk": None,
        "acceptance": acceptance,
        "samples": [s.to_dict() for s in samples],
        "errors": 0,
    }
    bad = [s for s in samples if not s.ok]
    m["errors"] = len(bad)
    if status in ("skipped", "failed"):
        m["acceptance"] = None
        return m
    if bad:
        m["status"] = "failed"
        m["reason"] = f"{len(bad)} of {len(samples)} requests failed: {bad[0].error}"
        m["acceptance"] = None
        return m
    if not samples:
        m["status"], m["reason"] = "failed", "no requests completed"
        return m
    # per repetition: median of per-request decode tok/s; headline = median over repetitions
    reps = sorted({s.rep for s in samples})
    rep_tok = [
        statistics.median([s.tok_s for s in samples if s.rep == r and s.tok_s])
        for r in reps
        if any(s.tok_s for s in samples if s.rep == r)
    ]
    m["tok_s"] = _r(statistics.median(rep_tok), 2) if rep_tok else None
    m["tok_s_spread"] = [_r(min(rep_tok), 2), _r(max(rep_tok), 2)] if rep_tok else None
    if rep_walls:
        agg = []
        for r, wall in zip(reps, rep_walls):
            toks = sum(s.output_tokens for s in samples if s.rep == r)
            agg.append(toks / wall if wall > 0 else None)
        agg = [a for a in agg if a]
        m["aggregate_tok_s"] = _r(statistics.median(agg), 2) if agg else None
    if m["tok_s"] is None and workload != "concurrency":
        # every token arrived in the same read (a buffering proxy, a server that batches the whole
        # answer): there is no decode time to measure, so no figure rather than an invented one
        m["status"], m["reason"] = "failed", "no decode time measurable: all output tokens arrived at once"
        m["acceptance"], m["aggregate_tok_s"] = None, None
        return m
    ttft = [s.ttft_s for s in samples]
    tpot = [s.tpot_s * 1000 for s in samples if s.tpot_s is not None]
    m["ttft_s"] = {"p50": _r(pct(ttft, 50), 5), "p99": _r(pct(ttft, 99), 5)}
    m["tpot_ms"] = {"p50": _r(pct(tpot, 50), 4), "p99": _r(pct(tpot, 99), 4)} if tpot else None
    m["e2e_s"] = {"p50": _r(pct([s.e2e_s for s in samples], 50), 5)}
    tpc = [s.tokens_per_chunk for s in samples if s.tokens_per_chunk]
    m["tokens_per_chunk"] = _r(statistics.median(tpc), 3) if tpc else None
    return m


# -- workloads -------------------------------------------------------------------------------------
class Point:
    """Where a measurement runs: the server's tp/method and the profile's warmup/repetitions."""

    def __init__(
        self,
        tp: int,
        method: str,
        budget: int | None,
        label: str,
        warmup: int,
        reps: int,
        prompt_tokens: int = 128,
        metrics_url: str | None = None,
        deadline_s: float | None = None,
    ):
        self.tp, self.method, self.budget, self.label = tp, method, budget, label
        self.warmup, self.reps, self.prompt_tokens = warmup, reps, prompt_tokens
        self.metrics_url = metrics_url
        self.deadline_s = deadline_s

    def rec(self, **kw) -> dict[str, Any]:
        return measurement(
            tp=self.tp, label=self.label, method=self.method, budget=self.budget, repetitions=self.reps, **kw
        )


async def _warm(c: Client, p: Point, req: Request) -> None:
    for _ in range(p.warmup):
        w = Request(
            min(req.max_tokens, WARMUP_TOKENS), prompt=req.prompt, messages=req.messages, ignore_eos=True
        )
        await c.stream(w, deadline_s=p.deadline_s)


def _scrape(p: Point):
    return metrics.scrape(p.metrics_url) if p.metrics_url else None


async def _repeat(
    c: Client, p: Point, make, concurrency: int
) -> tuple[list[Sample], list[float], dict | None]:
    before = _scrape(p)
    samples: list[Sample] = []
    walls: list[float] = []
    for rep in range(p.reps):
        reqs = make(rep)
        got, wall = await run_concurrent(c, reqs, concurrency, rep=rep, deadline_s=p.deadline_s)
        samples += got
        walls.append(wall)
        if any(not s.ok for s in got):
            break  # a failing server: stop here, report what happened
    acc = metrics.acceptance(before, _scrape(p))
    return samples, walls, acc


async def decode(c: Client, p: Point, output_len: int) -> dict[str, Any]:
    kw = dict(workload="decode", key_suffix=f"out{output_len}", output_len=output_len)
    prompt = await c.prompt_of(p.prompt_tokens)
    try:
        await c.check_fits(p.prompt_tokens, output_len)
    except ContextTooLong as exc:
        return p.rec(status="skipped", reason=str(exc), **kw)
    req = Request(output_len, prompt=prompt)
    await _warm(c, p, req)
    samples, walls, acc = await _repeat(c, p, lambda rep: [req], 1)
    return p.rec(samples=samples, acceptance=acc, **kw)


async def concurrency(c: Client, p: Point, conc: int, output_len: int) -> dict[str, Any]:
    kw = dict(workload="concurrency", key_suffix=f"c{conc}", output_len=output_len, concurrency=conc)
    try:
        await c.check_fits(p.prompt_tokens, output_len)
    except ContextTooLong as exc:
        return p.rec(status="skipped", reason=str(exc), **kw)
    prompts = [await c.prompt_of(p.prompt_tokens, salt=i) for i in range(conc)]
    await _warm(c, p, Request(output_len, prompt=prompts[0]))
    samples, walls, acc = await _repeat(
        c, p, lambda rep: [Request(output_len, prompt=q) for q in prompts], conc
    )
    return p.rec(samples=samples, rep_walls=walls, acceptance=acc, **kw)


async def long_context(c: Client, p: Point, ctx_tokens: int, output_len: int) -> dict[str, Any]:
    kw = dict(
        workload="long_context",
        key_suffix=f"ctx{ctx_tokens}",
        output_len=output_len,
        context_tokens=ctx_tokens,
    )
    try:
        await c.check_fits(ctx_tokens, output_len)  # before building a 100k-token prompt
    except ContextTooLong as exc:
        return p.rec(status="skipped", reason=str(exc), **kw)
    prompt = await c.prompt_of(ctx_tokens)
    req = Request(output_len, prompt=prompt)
    await _warm(c, p, Request(output_len, prompt=await c.prompt_of(min(ctx_tokens, 512))))
    samples, walls, acc = await _repeat(c, p, lambda rep: [req], 1)
    return p.rec(samples=samples, acceptance=acc, **kw)


async def agentic(
    c: Client, p: Point, turns: int, prefix_tokens: int, turn_tokens: int, output_len: int
) -> dict[str, Any]:
    """A chat session: a long shared system prompt, then turns that append user and assistant text."""
    final_ctx = prefix_tokens + turns * (turn_tokens + output_len + 8) + 3
    kw = dict(workload="agentic", key_suffix=f"turns{turns}", output_len=output_len, context_tokens=final_ctx)
    try:
        await c.check_fits(final_ctx, output_len)
    except ContextTooLong as exc:
        return p.rec(status="skipped", reason=str(exc), **kw)
    system = await c.prompt_of(prefix_tokens)
    users = [await c.prompt_of(turn_tokens, salt=i + 1) for i in range(turns)]
    answer = " ".join(["done"] * output_len)

    def session(rep: int) -> list[list[dict]]:
        msgs, out = [{"role": "system", "content": system}], []
        for u in users:
            msgs = msgs + [{"role": "user", "content": u}]
            out.append(msgs)
            msgs = msgs + [{"role": "assistant", "content": answer}]
        return out

    await _warm(c, p, Request(output_len, messages=session(0)[0], thinking=False))
    before = _scrape(p)
    samples: list[Sample] = []
    for rep in range(p.reps):
        for msgs in session(rep):  # turns are sequential: each waits for the previous answer
            s = await c.stream(
                Request(output_len, messages=msgs, thinking=False), rep=rep, deadline_s=p.deadline_s
            )
            samples.append(s)
            if not s.ok:
                break
        if any(not s.ok for s in samples):
            break
    acc = metrics.acceptance(before, _scrape(p))
    return p.rec(samples=samples, acceptance=acc, **kw)


RUNNERS = {"decode": decode, "concurrency": concurrency, "long_context": long_context, "agentic": agentic}


def not_run(
    tp: int,
    method: str,
    budget: int | None,
    label: str,
    kind: str,
    kw: dict[str, Any],
    status: str,
    reason: str,
    reps: int,
) -> dict[str, Any]:
    """A measurement that could not run (server failed to start, died earlier)."""
    suffix = key_of(tp, label, kind, kw).split("/", 3)[3]
    return measurement(
        tp=tp,
        label=label,
        method=method,
        budget=budget,
        workload=kind,
        key_suffix=suffix,
        output_len=kw.get("output_len"),
        concurrency=kw.get("conc", 1),
        context_tokens=kw.get("ctx_tokens"),
        status=status,
        reason=reason,
        repetitions=reps,
    )
