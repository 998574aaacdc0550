"""The simulated server's performance model: decode rates by method, TP size, output length,
concurrency and context (the seed's reference figures), prefill time, and speculative decoding's
acceptance (mean accepted length -> per-position acceptance probability). A SIMULATOR's figures.
"""

from __future__ import annotations

import math

# -- the performance model (docs/facts.md "Reference figures", Qwen3.6-27B, 8x RTX PRO 6000, PCIe) ------------
# single-stream decode tok/s at 1024 output tokens, per TP size
BASE_1024 = {
    "auto": {1: 26.6, 4: 37.8, 8: 37.6},
    "ddtree": {1: 173.4, 4: 281.1, 8: 263.9},
    "linear": {1: 106.0, 4: 106.0 * 281.1 / 173.4, 8: 106.0 * 263.9 / 173.4},
}
# TP1 figures at 256/1024/2048 output tokens: the shape of the output-length curve
OUT_CURVE = {
    "auto": {256: 26.4 / 26.6, 1024: 1.0, 2048: 26.4 / 26.6},
    "ddtree": {256: 123.9 / 173.4, 1024: 1.0, 2048: 168.8 / 173.4},
    "linear": {256: 99.7 / 106.0, 1024: 1.0, 2048: 121.0 / 106.0},
}
# per-request slowdown with C concurrent streams: rate / (1 + a * (C - 1)); from the seed's C=8
# aggregates (TP4 1270.8, TP8 727.0 tok/s for DDTree b15); auto batches almost for free.
CONTENTION = {
    "auto": {1: 0.02, 4: 0.02, 8: 0.02},
    "ddtree": {1: 0.15, 4: 0.110, 8: 0.272},
    "linear": {1: 0.12, 4: 0.09, 8: 0.2},
}
# long context: rate / (1 + max(0, ctx - 16k) / K); K from DDTree b15 at 100k: TP4 5.7, TP8 35.2 tok/s
LONG_K = {1: 4000.0, 4: 1737.0, 8: 12900.0}
# mean acceptance length (1 + accepted/drafts) per budget; independent of TP on a healthy box
ACCEPT_LEN = {"linear": 4.0, "ddtree": {15: 6.5, 16: 6.6, 32: 7.2, 64: 7.6}}
BUDGET_COST = {15: 1.0, 16: 1.0, 32: 0.95, 64: 0.85}
PREFILL_TOK_S = {1: 6000.0, 4: 16000.0, 8: 20000.0}
TTFT_BASE_S = 0.030


def tp_key(tp: int) -> int:
    return min((1, 4, 8), key=lambda k: abs(k - tp))


def _curve(method: str, out_len: int) -> float:
    pts = sorted(OUT_CURVE[method].items())
    x = math.log2(max(out_len, 1))
    for (a, fa), (b, fb) in zip(pts, pts[1:]):
        la, lb = math.log2(a), math.log2(b)
        if x <= lb:
            t = min(max((x - la) / (lb - la), 0.0), 1.0)
            return fa + t * (fb - fa)
    return pts[-1][1]


def decode_rate(method: str, budget: int, tp: int, out_len: int, active: int, ctx_tokens: int) -> float:
    """Simulated per-request decode tok/s (before the speed factor)."""
    k = tp_key(tp)
    r = BASE_1024[method][k] * _curve(method, out_len)
    if method == "ddtree":
        r *= BUDGET_COST.get(budget, 0.85)
    r /= 1.0 + CONTENTION[method][k] * max(active - 1, 0)
    r /= 1.0 + max(0, ctx_tokens - 16384) / LONG_K[k]
    return r


def accept_prob(mean_len: float, budget: int) -> float:
    """p with sum_{i=1..B} p^i = mean_len - 1: each draft position accepted given the previous one."""
    target = mean_len - 1.0
    lo, hi = 0.0, 0.9999
    for _ in range(60):
        mid = (lo + hi) / 2
        s = sum(mid**i for i in range(1, budget + 1))
        lo, hi = (mid, hi) if s < target else (lo, mid)
    return lo
