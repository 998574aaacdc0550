"""Speculative-decoding counters from a server's Prometheus /metrics.

vLLM exposes cumulative counters (docs/facts.md "Serving benchmarks"):
`vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_total` and
`vllm:spec_decode_num_accepted_tokens_per_pos_total{position=..}`. A measurement scrapes before and
after and reports the deltas: mean acceptance length = 1 + accepted/drafts, acceptance rate =
accepted/draft_tokens, per-position rate = accepted_at_pos/drafts. A server without these counters
(auto, SGLang) gives `None` ("absent"), never zeros.

Parsing uses prometheus_client's own text parser (already a dependency) rather than regexes.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
MAX_BYTES = 32 << 20  # vLLM's /metrics is ~100 KiB; more is not a metrics page


def parse(text: str) -> dict[str, Any] | None:
    """Spec-decode counters summed over engines/models; None when the server has none or the text
    is not Prometheus exposition (issue 16: garbage /metrics fails nothing, it is just absent)."""
    try:
        return _parse(text)
    except Exception:  # prometheus_client raises ValueError, IndexError, ... on garbage
        return None


def _parse(text: str) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith(PREFIX) or not s.name.endswith("_total"):
                continue
            short = s.name[len(PREFIX) : -len("_total")]
            if short == PER_POS:
                pos = int(s.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            elif short in COUNTERS:
                out[short] = out.get(short, 0.0) + s.value
    if not out:
        return None
    out["per_pos"] = [per_pos[k] for k in sorted(per_pos)]
    return out


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """Counters now, or None when /metrics is missing or has no spec-decode counters."""
    import time

    deadline = time.monotonic() + timeout  # whole-scrape bound: a trickling /metrics cannot hang a run
    buf = bytearray()
    try:
        with httpx.stream("GET", base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
            if r.status_code != 200:
                return None
            for part in r.iter_raw():
                buf += part
                if len(buf) > MAX_BYTES or time.monotonic() > deadline:
                    return None
    except httpx.HTTPError:
        return None
    return parse(buf.decode("utf-8", errors="replace"))


def acceptance(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Acceptance figures over the interval, or None when the counters are absent or did not move."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    drafts = d["num_drafts"]
    if drafts <= 0:
        return None
    pb, pa = before.get("per_pos") or [], after.get("per_pos") or []
    per_pos = [(pa[i] - (pb[i] if i < len(pb) else 0.0)) / drafts for i in range(len(pa))]
    rate = d["num_accepted_tokens"] / d["num_draft_tokens"] if d["num_draft_tokens"] > 0 else None
    return {
        "mean_length": round(1.0 + d["num_accepted_tokens"] / drafts, 4),
        "rate": None if rate is None else round(rate, 4),
        "per_position": [round(x, 4) for x in per_pos],
        "drafts": int(drafts),
        "draft_tokens": int(d["num_draft_tokens"]),
        "accepted": int(d["num_accepted_tokens"]),
    }
