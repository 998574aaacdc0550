"""The serving plan: the default configuration and when to switch (context, concurrency, output
length), each row with its evidence and whether it is beyond the noise."""

from __future__ import annotations

import math

from .advice_model import CLEAR, NOISE_K, UNKNOWN, WITHIN, Config, Gap, PlanRow, WorkloadAdvice, order_key
from .data import ResultDoc
from .observations import ctx_name, f1, ref_len


def _evidence(w: WorkloadAdvice, against: Config | None = None) -> str:
    """'1024-token output: 281.1 vs 263.9 tok/s TP8 DDTree b15, exceeds the noise'."""
    b = w.best
    r = next((p for p in w.ranking if p.config == against), None) if against else w.runner_up
    if r is None:
        return f"{w.title}: {f1(b.value)} {w.unit}, no runner-up"
    ratio = (
        f"{b.value / r.value:.1f}x"
        if r.value and b.value / r.value >= 1.5
        else f"{(b.value / r.value - 1) * 100:+.1f}%"
    )
    if r is not w.runner_up:
        word = "vs the default"
        return f"{w.title}: {f1(b.value)} vs {f1(r.value)} {w.unit} ({ratio}, {word} {r.config.name})"
    word = {CLEAR: "exceeds the noise", WITHIN: "inside the noise", UNKNOWN: "noise unknown"}[w.decision]
    return f"{w.title}: {f1(b.value)} vs {f1(r.value)} {w.unit} {r.config.name} ({ratio}, {word})"


def _against_decided(w: WorkloadAdvice, default: Config) -> bool:
    """Does the winner beat the default here by more than the noise?"""
    d = next((p for p in w.ranking if p.config == default), None)
    b = w.best
    sds = [s for s in (b.noise.sd, d.noise.sd) if s is not None] if d is not None else []
    if not sds:
        return False
    pooled = math.sqrt(sum(s * s for s in sds) / len(sds))
    return b.value - d.value > NOISE_K * pooled


def _range(vals: list[int]) -> str:
    vals = sorted(set(vals))
    return str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"


def plan(run: ResultDoc, points: list[WorkloadAdvice]) -> tuple[list[PlanRow], list[Gap]]:
    ref = ref_len(run)
    ranked = [w for w in points if w.best is not None]
    base = next((w for w in ranked if w.kind == "decode" and w.output_len == ref), None)
    base = (
        base or next((w for w in ranked if w.kind == "concurrency"), None) or (ranked[0] if ranked else None)
    )
    if base is None:
        return [], []
    default = base.best.config
    won: list[WorkloadAdvice] = []
    lost: list[WorkloadAdvice] = []
    for w in ranked:
        if w is base:
            continue
        if w.best.config == default:
            if w.runner_up is not None:  # measured alone it beat nothing: no claim, a gap names the rest
                won.append(w)
        elif any(p.config == default for p in w.ranking):
            lost.append(w)
    when = ["default"]
    single = [w.output_len for w in [base, *won] if w.kind == "decode"]
    if single:
        when.append(f"single requests ({'/'.join(map(str, sorted(set(single))))}-token outputs)")
    conc = [w.concurrency for w in won if w.kind == "concurrency"]
    if conc:
        when.append(f"concurrency C={_range(conc)}")
    ctxs = [w.context_tokens for w in won if w.kind in ("long_context", "agentic")]
    lost_ctxs = [w.context_tokens for w in lost if w.kind in ("long_context", "agentic") and w.context_tokens]
    if ctxs and lost_ctxs and max(ctxs) > min(lost_ctxs):
        # another configuration wins between the default's contexts: "up to" would cover its row
        # too (every workload belongs to one row), so name the contexts the default won
        when.append(f"context of {', '.join(ctx_name(c) for c in sorted(set(ctxs)))} tokens")
    elif ctxs:
        when.append(f"context up to {ctx_name(max(ctxs))} tokens")
    rows = [
        PlanRow(
            when[0] + ": " + ", ".join(when[1:]) if len(when) > 1 else when[0],
            default,
            _evidence(base),
            base.decision == CLEAR,
            [base.id, *(w.id for w in won)],
        )
    ]
    gaps: list[Gap] = []
    # switches: the default measured and beaten; one row per (kind, new config), from the
    # smallest point where it wins
    by: dict[tuple[str, Config], list[WorkloadAdvice]] = {}
    for w in lost:
        kind = "context" if w.kind in ("long_context", "agentic") else w.kind
        by.setdefault((kind, w.best.config), []).append(w)
    for (kind, cfg), ws in by.items():
        ws = sorted(ws, key=order_key)
        if kind == "context":
            th = min(w.context_tokens or 0 for w in ws)
            hi = max(w.context_tokens or 0 for w in ws)
            longer = [c for c in ctxs if c > hi]
            if longer:  # the default wins again above: a bounded range, not "or more"
                span = ctx_name(th) if hi == th else f"{ctx_name(th)} to {ctx_name(hi)}"
                when_txt = f"prompts of {span} tokens (the default wins again at {ctx_name(min(longer))})"
            else:
                when_txt = f"prompts of {ctx_name(th)} tokens or more"
            shorter = [
                w.context_tokens
                for w in won
                if w.context_tokens and w.context_tokens < th and any(p.config == cfg for p in w.ranking)
            ]
            if shorter:
                when_txt += f" (the default still wins at {ctx_name(max(shorter))})"
            else:
                gaps.append(
                    Gap(
                        "not_measured",
                        f"the context threshold for {cfg.name}: {default.name} vs {cfg.name} not compared below "
                        f"{ctx_name(th)} context (a long-context run at shorter prompts would place it)",
                    )
                )
        elif kind == "concurrency":
            when_txt = f"concurrency C={min(w.concurrency or 0 for w in ws)} or more"
        else:
            when_txt = f"outputs of {min(w.output_len or 0 for w in ws)} tokens or more"
        rows.append(
            PlanRow(
                when_txt,
                cfg,
                "; ".join(_evidence(w, default) for w in ws),
                all(_against_decided(w, default) for w in ws),
                [w.id for w in ws],
            )
        )
    return rows, gaps
