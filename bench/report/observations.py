"""Findings: short sentences with the numbers in them, each made only where the data shows it.

One module (about 530 lines) on purpose: every observation is a short, independent function over the
same indexed run, read and checked side by side.

Each function looks at one run (or a pair, for before/after) and returns zero or more Observation.
A finding needs every measurement it quotes to be `ok`; a failed or missing point means no finding,
never a guess. Thresholds are named constants so the wording ("flat", "slower") is checkable.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .data import Measurement, ResultDoc, method_name, method_order

FLAT_PCT = 5.0  # auto within this spread across TP is "flat"
TP_DIFF_PCT = 2.0  # a larger TP this much slower/faster than a smaller one is worth saying
DRIFT_PCT = 5.0  # acceptance length spread across TP above this is a drift (a red flag: docs/facts.md "Serving benchmarks")
LONG_CTX_X = 1.05  # ratio between TPs at long context worth saying
PREFERRED_LEN = 1024  # the seed compared methods and TPs at 1024 output tokens


@dataclass
class Observation:
    id: str
    level: str  # good | info | warn
    text: str
    run: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "level": self.level,
            "text": self.text,
            "run": self.run,
            "numbers": self.numbers,
        }


def f1(x: float) -> str:
    return f"{x:.1f}"


def ctx_name(n: int | None) -> str:
    """100000 -> '100k', 4096 -> '4k', 900 → '900'."""
    if not n:
        return "?"
    return f"{round(n / 1000)}k" if n >= 1000 else str(n)


def pct(a: float, b: float) -> float:
    """Change from a to b in percent."""
    return (b - a) / a * 100.0


def ref_len(run: ResultDoc) -> int | None:
    """The output length to compare methods and TPs at: 1024 when measured, else the most common."""
    lens = [m.output_len for m in run.select("decode") if m.ok and m.output_len]
    if not lens:
        return None
    if PREFERRED_LEN in lens:
        return PREFERRED_LEN
    counts = Counter(lens)  # lens.count per distinct length was quadratic in the measurements
    return max(set(lens), key=counts.__getitem__)


def decode_ok(run: ResultDoc, tp: int, label: str, out: int | None) -> Measurement | None:
    m = run.get("decode", tp=tp, label=label, output_len=out)
    return m if m is not None and m.value is not None else None


def spec_labels(run: ResultDoc, workload: str = "decode") -> list[tuple[str, str | None, int | None]]:
    return [t for t in run.labels(workload) if str(t[1]).lower() not in ("auto", "ar", "autoregressive")]


def auto_label(run: ResultDoc) -> str | None:
    for lab, meth, _ in run.labels("decode"):
        if str(meth).lower() in ("auto", "ar", "autoregressive"):
            return lab
    return None


def tps(run: ResultDoc, workload: str | None = None) -> list[int]:
    """The TP sizes measured (for a workload); computed once per run and workload: the findings
    ask once per configuration, and a scan per question was quadratic in the measurements."""
    cache = run.__dict__.setdefault("_tps_cache", {})
    key = (workload, len(run.measurements))
    if key not in cache:
        cache[key] = sorted({m.tp for m in run.select(workload)})
    return list(cache[key])


# --- single-run findings ------------------------------------------------------------------------


def spec_speedup(run: ResultDoc) -> list[Observation]:
    """Speculative decoding over auto at TP1 (where one GPU isolates the method's own gain)."""
    L, auto = ref_len(run), auto_label(run)
    base = decode_ok(run, 1, auto, L) if auto else None
    if base is None:
        return []
    best: dict[str, Measurement] = {}
    for lab, meth, bud in spec_labels(run):
        m = decode_ok(run, 1, lab, L)
        fam = method_name(meth, None)
        if m and (fam not in best or m.value > best[fam].value):
            best[fam] = m
    if not best:
        return []
    order = sorted(best.values(), key=lambda m: -m.value)
    top = order[0]
    x = top.value / base.value
    others = "; ".join(f"{m.method_name} {f1(m.value)} ({m.value / base.value:.1f}x)" for m in order[1:])
    verb = "=" if x >= 1 else "is slower than auto:"
    text = (
        f"{top.method_name} at TP1: {f1(top.value)} tok/s {verb} {x:.1f}x auto "
        f"({f1(base.value)} tok/s) at {L}-token outputs" + (f"; {others}" if others else "")
    )
    return [
        Observation(
            "spec_speedup_tp1",
            "good" if x > 1 else "warn",
            text,
            run.name,
            {
                "tok_s": top.value,
                "auto_tok_s": base.value,
                "speedup": round(x, 2),
                "label": top.label,
                "output_len": L,
            },
        )
    ]


def _numa_nodes(run: ResultDoc, tp: int, label: str) -> set[int] | None:
    srv = run.server_for(tp, label)
    gpus = srv.gpus if srv else None
    if not isinstance(gpus, list) or len(gpus) != tp:
        return None
    numa = run.gpu_numa()
    nodes = {numa.get(g) for g in gpus}
    return None if None in nodes or not nodes else nodes


def _over_pcie(run: ResultDoc) -> bool:
    """True when the facts show PCIe links and no NVLink (the seed box: RTX PRO 6000, PCIe only)."""
    gpus = run.facts.gpu_list()
    links = " ".join(str(g.link or "") for g in gpus).lower()
    return bool(gpus) and "gen" in links and "nvlink" not in links


def tp_scaling(run: ResultDoc) -> list[Observation]:
    """A larger TP slower than a smaller multi-GPU TP, and why when the facts say (NUMA span)."""
    L, out = ref_len(run), []
    for lab, meth, bud in sorted(spec_labels(run), key=lambda t: method_order(*t)):
        have = [tp for tp in tps(run, "decode") if tp > 1 and decode_ok(run, tp, lab, L)]
        for a, b in zip(have, have[1:]):
            ma, mb = decode_ok(run, a, lab, L), decode_ok(run, b, lab, L)
            d = pct(ma.value, mb.value)
            name = ma.method_name
            nums = {
                "label": lab,
                "tp_small": a,
                "tp_large": b,
                "tok_s_small": ma.value,
                "tok_s_large": mb.value,
                "pct": round(d, 1),
                "output_len": L,
            }
            if d <= -TP_DIFF_PCT:
                why = ""
                na, nb = _numa_nodes(run, a, lab), _numa_nodes(run, b, lab)
                if na is not None and nb is not None and len(nb) > 1 and len(na) == 1:
                    link = " over PCIe" if _over_pcie(run) else ""
                    why = (
                        f": TP{b} spans NUMA nodes {' and '.join(map(str, sorted(nb)))}{link}, "
                        f"TP{a} stays on node {next(iter(na))}"
                    )
                    nums["numa_nodes_large"] = sorted(nb)
                out.append(
                    Observation(
                        "tp_larger_slower",
                        "warn",
                        f"TP{b} is {abs(d):.1f}% slower than TP{a} for {name} "
                        f"({f1(mb.value)} vs {f1(ma.value)} tok/s){why}",
                        run.name,
                        nums,
                    )
                )
            elif d >= TP_DIFF_PCT:
                out.append(
                    Observation(
                        "tp_larger_faster",
                        "info",
                        f"TP{b} is {d:.1f}% faster than TP{a} for {name} "
                        f"({f1(mb.value)} vs {f1(ma.value)} tok/s)",
                        run.name,
                        nums,
                    )
                )
            else:
                out.append(
                    Observation(
                        "tp_larger_same",
                        "info",
                        f"TP{b} gains nothing over TP{a} for {name} "
                        f"({f1(mb.value)} vs {f1(ma.value)} tok/s, within {TP_DIFF_PCT:g}%)",
                        run.name,
                        nums,
                    )
                )
    return out


def auto_flat(run: ResultDoc) -> list[Observation]:
    """Autoregressive decode across TP: flat means batch-1 decode is memory-bandwidth-bound."""
    L, auto = ref_len(run), auto_label(run)
    if not auto:
        return []
    pts = [(tp, decode_ok(run, tp, auto, L)) for tp in tps(run, "decode")]
    pts = [(tp, m) for tp, m in pts if m]
    if len(pts) < 2:
        return []
    vals = [m.value for _, m in pts]
    spread = (max(vals) - min(vals)) / min(vals) * 100
    series = "/".join(f1(v) for v in vals)
    at = "TP" + "/".join(str(tp) for tp, _ in pts)
    nums = {"tok_s": vals, "tp": [tp for tp, _ in pts], "spread_pct": round(spread, 1)}
    if spread <= FLAT_PCT:
        return [
            Observation(
                "auto_flat",
                "info",
                f"auto is flat across TP ({series} tok/s at {at}): memory-bandwidth-bound at "
                f"batch 1, so more GPUs do not speed up one sequence",
                run.name,
                nums,
            )
        ]
    return [
        Observation(
            "auto_varies",
            "info",
            f"auto varies {spread:.1f}% across TP ({series} tok/s at {at})",
            run.name,
            nums,
        )
    ]


def long_context(run: ResultDoc) -> list[Observation]:
    """Largest-TP vs next TP at the longest context both measured."""
    out = []
    for lab, meth, bud in spec_labels(run, "long_context") + [
        t for t in run.labels("long_context") if t not in spec_labels(run, "long_context")
    ]:
        by_ctx: dict[int, dict[int, Measurement]] = {}
        for m in run.select("long_context", label=lab):
            if m.value is not None and m.context_tokens:
                by_ctx.setdefault(m.context_tokens, {})[m.tp] = m
        both = [(c, d) for c, d in by_ctx.items() if len(d) >= 2]
        if not both:
            continue
        ctx, d = max(both, key=lambda t: t[0])
        tp_list = sorted(d)
        a, b = tp_list[-2], tp_list[-1]
        ma, mb = d[a], d[b]
        x = mb.value / ma.value
        nums = {
            "label": lab,
            "context_tokens": ctx,
            "tp_small": a,
            "tp_large": b,
            "tok_s_small": ma.value,
            "tok_s_large": mb.value,
            "ratio": round(x, 2),
        }
        if x >= LONG_CTX_X:
            out.append(
                Observation(
                    "long_context_large_tp_wins",
                    "info",
                    f"at {ctx_name(ctx)} context TP{b} beats TP{a} {x:.1f}x for {ma.method_name} "
                    f"({f1(mb.value)} vs {f1(ma.value)} tok/s)",
                    run.name,
                    nums,
                )
            )
        elif x <= 1 / LONG_CTX_X:
            out.append(
                Observation(
                    "long_context_small_tp_wins",
                    "info",
                    f"at {ctx_name(ctx)} context TP{a} beats TP{b} {1 / x:.1f}x for "
                    f"{ma.method_name} ({f1(ma.value)} vs {f1(mb.value)} tok/s)",
                    run.name,
                    nums,
                )
            )
    return out


def concurrency(run: ResultDoc) -> list[Observation]:
    """Aggregate tok/s gain from the lowest to the highest concurrency, per method, across TPs."""
    out = []
    for lab, meth, bud in run.labels("concurrency"):
        parts, nums, top = [], {}, {}
        for tp in tps(run, "concurrency"):
            pts = {
                m.concurrency: m
                for m in run.select("concurrency", tp=tp, label=lab)
                if m.value is not None and m.concurrency
            }
            if len(pts) < 2:
                continue
            lo, hi = min(pts), max(pts)
            g = pts[hi].value / pts[lo].value
            parts.append(f"TP{tp} {f1(pts[lo].value)} → {f1(pts[hi].value)} ({g:.1f}x)")
            nums[f"tp{tp}"] = {
                "c_low": lo,
                "c_high": hi,
                "low": pts[lo].value,
                "high": pts[hi].value,
                "gain": round(g, 2),
            }
            top[tp] = (hi, pts[hi].value)
        if not parts:
            continue
        cs = {v["c_low"] for v in nums.values()}, {v["c_high"] for v in nums.values()}
        span = f"C={min(cs[0])} to C={max(cs[1])}"
        text = f"{method_name(meth, bud)} aggregate tok/s from {span}: " + ", ".join(parts)
        same_c = {c for c, _ in top.values()}
        if len(top) >= 2 and len(same_c) == 1:
            ranked = sorted(top.items(), key=lambda t: -t[1][1])
            (tb, (c, vb)), (tw, (_, vw)) = ranked[0], ranked[-1]
            text += f"; at C={c} TP{tb} delivers {vb / vw:.2f}x TP{tw}'s aggregate"
        out.append(Observation("concurrency_gain", "good", text, run.name, nums))
    return out


def acceptance(run: ResultDoc) -> list[Observation]:
    """Mean acceptance length should not depend on TP (docs/facts.md "Serving benchmarks")."""
    L, out = ref_len(run), []
    for lab, meth, bud in spec_labels(run):
        pts = []
        for tp in tps(run, "decode"):
            m = run.get("decode", tp=tp, label=lab, output_len=L)
            if m is None or m.accept_len is None:
                cands = [x for x in run.select("decode", tp=tp, label=lab) if x.accept_len is not None]
                m = cands[0] if cands else None
            if m is not None and m.accept_len is not None:
                pts.append((tp, m.accept_len))
        if len(pts) < 2:
            continue
        vals = [v for _, v in pts]
        spread = (max(vals) - min(vals)) / min(vals) * 100
        series = "/".join(f"{v:.2f}".rstrip("0").rstrip(".") for v in vals)
        at = "TP" + "/".join(str(t) for t, _ in pts)
        nums = {"label": lab, "tp": [t for t, _ in pts], "mean_length": vals, "spread_pct": round(spread, 1)}
        name = method_name(meth, bud)
        if spread > DRIFT_PCT:
            out.append(
                Observation(
                    "acceptance_drift",
                    "warn",
                    f"acceptance length of {name} drifts {spread:.1f}% across TP ({series} at {at}): "
                    f"it should not depend on TP, check the drafter and verification at "
                    f"TP{pts[vals.index(min(vals))][0]}",
                    run.name,
                    nums,
                )
            )
        else:
            out.append(
                Observation(
                    "acceptance_stable",
                    "info",
                    f"acceptance length of {name} is stable across TP ({series} at {at})",
                    run.name,
                    nums,
                )
            )
    return out


def not_measured(run: ResultDoc) -> list[Observation]:
    bad = [m for m in run.measurements if not m.ok]
    if not bad:
        return []
    n_f = sum(1 for m in bad if m.status == "failed")
    n_s = len(bad) - n_f
    head = " and ".join(p for p in (f"{n_f} failed" if n_f else "", f"{n_s} skipped" if n_s else "") if p)
    shown = "; ".join(f"{m.key} {m.status}: {m.reason or 'no reason given'}" for m in bad[:3])
    more = f"; {len(bad) - 3} more in the table" if len(bad) > 3 else ""
    return [
        Observation(
            "not_measured",
            "warn",
            f"{head} of {len(run.measurements)} measurements: {shown}{more}",
            run.name,
            {"failed": n_f, "skipped": n_s, "keys": [m.key for m in bad]},
        )
    ]


SINGLE = (spec_speedup, tp_scaling, auto_flat, long_context, concurrency, acceptance, not_measured)


# --- before/after -------------------------------------------------------------------------------


def describe(m: Measurement) -> str:
    """'TP4 DDTree b15 C=8 aggregate' and the like, for deltas."""
    w = m.workload
    if w == "decode":
        what = f"{m.output_len} tok"
    elif w == "concurrency":
        what = f"C={m.concurrency} aggregate"
    else:
        what = f"{ctx_name(m.context_tokens)} {'context' if w == 'long_context' else w}"
    return f"TP{m.tp} {m.method_name} {what}"


def deltas(base: ResultDoc, new: ResultDoc) -> list[tuple[Measurement, Measurement, float]]:
    """Both-ok measurements with the same key, and the change in percent (base → new)."""
    old = {m.key: m for m in base.measurements if m.value is not None}
    out = []
    for m in new.measurements:
        b = old.get(m.key)
        if b is not None and m.value is not None and b.value:
            out.append((b, m, pct(b.value, m.value)))
    return out


def fact_changes(base: ResultDoc, new: ResultDoc) -> list[str]:
    """The tuning knobs that differ between the two runs' facts."""
    fa, fb, out = base.facts, new.facts, []
    if None not in (fa.numa_balancing, fb.numa_balancing) and fa.numa_balancing != fb.numa_balancing:
        out.append(f"NUMA balancing {fa.numa_balancing} → {fb.numa_balancing}")
    ma, mb = fa.pcie_mrrs or {}, fb.pcie_mrrs or {}
    if isinstance(ma, dict) and isinstance(mb, dict) and ma and mb:
        va, vb = sorted(set(map(str, ma.values()))), sorted(set(map(str, mb.values())))
        if va != vb:
            out.append(f"MaxReadReq {'/'.join(va)} → {'/'.join(vb)}")
    ea, eb = fa.nccl_env or {}, fb.nccl_env or {}
    if isinstance(ea, dict) and isinstance(eb, dict) and ea != eb:
        added = sorted(set(eb) - set(ea))
        removed = sorted(set(ea) - set(eb))
        changed = sorted(k for k in set(ea) & set(eb) if ea[k] != eb[k])
        bits = [
            f"+{', '.join(added)}" if added else "",
            f"-{', '.join(removed)}" if removed else "",
            f"changed {', '.join(changed)}" if changed else "",
        ]
        out.append("NCCL env " + " ".join(b for b in bits if b))
    if fa.driver and fb.driver and fa.driver != fb.driver:
        out.append(f"driver {fa.driver} → {fb.driver}")
    return out


def before_after(base: ResultDoc, new: ResultDoc, top: int = 3) -> list[Observation]:
    ds = deltas(base, new)
    if not ds:
        return []
    med = statistics.median(d for _, _, d in ds)
    ranked = sorted(ds, key=lambda t: -abs(t[2]))[:top]
    big = "; ".join(f"{describe(m)} {d:+.1f}% ({f1(b.value)} → {f1(m.value)})" for b, m, d in ranked)
    by_w: dict[str, list[float]] = {}
    for _, m, d in ds:
        by_w.setdefault(m.workload, []).append(d)
    per_w = ", ".join(f"{w.replace('_', ' ')} {statistics.median(v):+.1f}%" for w, v in by_w.items())
    multi_txt = f" ({per_w})" if len(by_w) > 1 else ""
    changes = fact_changes(base, new)
    ch = f" after {', '.join(changes)}" if changes else ""
    text = (
        f"{new.name} vs {base.name}{ch}: median {med:+.1f}% over {len(ds)} measurements"
        f"{multi_txt}; largest: {big}"
    )
    level = "good" if med > 0 else ("warn" if med < -TP_DIFF_PCT else "info")
    return [
        Observation(
            "before_after",
            level,
            text,
            new.name,
            {
                "base": base.name,
                "median_pct": round(med, 1),
                "n": len(ds),
                "fact_changes": changes,
                "median_pct_by_workload": {w: round(statistics.median(v), 1) for w, v in by_w.items()},
                "largest": [{"key": m.key, "pct": round(d, 1)} for _, m, d in ranked],
            },
        )
    ]


def simulated(run: ResultDoc) -> list[Observation]:
    """Say first when the figures are the simulator's, so nobody reads them as a GPU's."""
    if not run.result.simulated:
        return []
    k = run.result.sim_speed
    pace = f" paced at {f1(float(k))}x the seed box's real-time rates" if k else ""
    return [
        Observation(
            "simulated",
            "warn",
            f"figures come from gpubox's server simulator{pace}, not from GPUs: "
            "they test the pipeline, not the box",
            run.name,
            {"sim_speed": k},
        )
    ]


def observations(runs: list[ResultDoc], compare: bool = False) -> list[Observation]:
    """All findings: before/after first when comparing, then each run's own."""
    out: list[Observation] = [f for r in runs for f in simulated(r)]
    if compare and len(runs) >= 2:
        for r in runs[1:]:
            out += before_after(runs[0], r)
    for r in runs:
        for fn in SINGLE:
            out += fn(r)
    return out
