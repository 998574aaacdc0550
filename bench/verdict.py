"""The health verdict: healthy / degraded / failed, with one reason per finding.

Compared (all figures are decode tok/s of single-stream 1024-token runs unless said otherwise):
- with the inventory's expectations `gpubox_bench.expect` (tok_s per TP/method, tolerance,
  min_speedup_over_auto over the same TP's autoregressive run);
- with the box's own history: `baseline(key) -> float | None`, the median of the last good runs
  (bench.history.baseline, injected so this module stays pure and testable on recorded results);
- mean acceptance length across TP sizes for the same method and workload: it should not drift
  with TP (docs/facts.md "Serving benchmarks"); a drift is a red flag (degraded);
- TP scaling that inverts: a larger TP slower than TP1 for the same method (degraded);
- any request error or server failure (failed).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Callable

from .result_model import BenchResult, Measurement, Reason, Verdict

HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"
DEFAULTS = {
    "tolerance": 0.10,
    "min_speedup_over_auto": None,
    "acceptance_drift": 0.10,
    "output_len": 1024,
    "history_tolerance": None,
}


def _reason(level: str, key: str | None, message: str, observed=None, expected=None) -> Reason:
    return Reason.build(level=level, key=key, message=message, observed=observed, expected=expected)


def decide(
    doc: dict[str, Any] | BenchResult,
    expect: dict[str, Any] | None = None,
    baseline: Callable[[str], float | None] | None = None,
) -> dict[str, Any]:
    """Verdict for a result document (docs/result-schema.md): the reasons of six passes, in order
    (failures, the inventory's expectations, speedup over autoregressive, this box's history,
    acceptance drift across TP, TP scaling), failed over degraded over healthy. The verdict's JSON
    object (bench.result_model.Verdict)."""
    return decide_result(
        doc if isinstance(doc, BenchResult) else BenchResult.view(doc), expect, baseline
    ).to_dict()


def decide_result(
    doc: BenchResult,
    expect: dict[str, Any] | None = None,
    baseline: Callable[[str], float | None] | None = None,
) -> Verdict:
    """The typed verdict of DOC (see decide)."""
    ex = {**DEFAULTS, **(expect or {})}
    tol = float(ex["tolerance"])
    htol = float(ex["history_tolerance"] if ex["history_tolerance"] is not None else tol)
    out_len = int(ex["output_len"])
    ms = doc.measurements
    ok = [m for m in ms if m.status == "ok"]
    decode = {
        (m.tp, m.label): m for m in ok if m.workload == "decode" and m.output_len == out_len and m.tok_s
    }
    reasons = _failures(doc, ms)
    reasons += _below_expectations(decode, ex.get("tok_s") or {}, tol)
    if ex.get("min_speedup_over_auto"):
        reasons += _below_speedup(decode, float(ex["min_speedup_over_auto"]))
    if baseline is not None:
        reasons += _below_history(ok, baseline, htol)
    reasons += _acceptance_drift(ok, float(ex["acceptance_drift"]))
    reasons += _tp_inversions(decode, tol)
    if not ok and not reasons:
        reasons.append(_reason(FAILED, None, "no measurement completed"))
    levels = {r.level for r in reasons}
    status = FAILED if FAILED in levels else DEGRADED if DEGRADED in levels else HEALTHY
    return Verdict.build(status=status, reasons=reasons)


def _failures(doc: BenchResult, ms: list[Measurement]) -> list[Reason]:
    """1. Servers that did not start and measurements that failed."""
    out = []
    for s in doc.servers:
        if s.status == "failed":
            out.append(_reason(FAILED, f"tp{s.tp}/{s.label}", f"TP{s.tp} {s.label} server failed: {s.error}"))
    for m in ms:
        if m.status == "failed":
            out.append(_reason(FAILED, m.key, f"{m.key} failed: {m.reason}"))
    return out


def _below_expectations(decode: dict, exp_tok: dict, tol: float) -> list[Reason]:
    """2. Decode rates below the inventory's expectations (tok_s: {tpN: {label: rate}})."""
    out = []
    for tp_key, per_method in exp_tok.items():
        try:
            tp = int(str(tp_key).lower().lstrip("tp"))
        except ValueError:
            continue
        for label, expected in (per_method or {}).items():
            m = decode.get((tp, str(label)))
            if m is None or expected is None:
                continue
            obs = m.tok_s
            floor = float(expected) * (1 - tol)
            if obs < floor:
                below = (1 - obs / float(expected)) * 100
                out.append(
                    _reason(
                        DEGRADED,
                        m.key,
                        f"TP{tp} {label} decode {obs:.1f} tok/s is {below:.1f}% below the expected "
                        f"{float(expected):.1f} (tolerance {tol * 100:.0f}%)",
                        obs,
                        float(expected),
                    )
                )
    return out


def _below_speedup(decode: dict, min_sp: float) -> list[Reason]:
    """3. A speculative method's speedup over autoregressive at the same TP."""
    out = []
    for (tp, label), m in decode.items():
        auto = decode.get((tp, "auto"))
        if label == "auto" or auto is None:
            continue
        sp = m.tok_s / auto.tok_s
        if sp < min_sp:
            out.append(
                _reason(
                    DEGRADED,
                    m.key,
                    f"TP{tp} {label} is only {sp:.2f}x autoregressive ({m.tok_s:.1f} vs "
                    f"{auto.tok_s:.1f} tok/s); expected at least {min_sp:.2f}x",
                    round(sp, 3),
                    min_sp,
                )
            )
    return out


def _below_history(
    ok: list[Measurement], baseline: Callable[[str], float | None], htol: float
) -> list[Reason]:
    """4. Below the median of the box's last good runs (a baseline that cannot be read is none)."""
    out = []
    for m in ok:
        obs = getattr(m, m.headline_field)
        if obs is None:
            continue
        try:
            base = baseline(m.key)
        except Exception:
            base = None
        if base and obs < base * (1 - htol):
            out.append(
                _reason(
                    DEGRADED,
                    m.key,
                    f"{m.key} {obs:.1f} tok/s is {(1 - obs / base) * 100:.1f}% below this "
                    f"box's recent median {base:.1f} (tolerance {htol * 100:.0f}%)",
                    obs,
                    base,
                )
            )
    return out


def _acceptance_drift(ok: list[Measurement], drift_tol: float) -> list[Reason]:
    """5. The mean acceptance length must not drift with TP (docs/facts.md "Serving benchmarks")."""
    by_point: dict[tuple, dict[int, float]] = defaultdict(dict)
    for m in ok:
        acc = m.acceptance
        if acc and acc.mean_length:
            suffix = m.key.split("/", 2)[2]
            by_point[(m.label, suffix)][m.tp] = acc.mean_length
    out = []
    for (label, suffix), per_tp in by_point.items():
        if len(per_tp) < 2:
            continue
        vals = list(per_tp.values())
        med = statistics.median(vals)
        spread = (max(vals) - min(vals)) / med if med else 0
        if spread > drift_tol:
            detail = ", ".join(f"TP{tp} {v:.2f}" for tp, v in sorted(per_tp.items()))
            out.append(
                _reason(
                    DEGRADED,
                    f"{label}/{suffix}",
                    f"{label} mean acceptance length drifts across TP sizes ({detail}; "
                    f"{spread * 100:.0f}% > {drift_tol * 100:.0f}%): the TP>1 path is "
                    f"computing something different",
                    round(spread, 4),
                    drift_tol,
                )
            )
    return out


def _tp_inversions(decode: dict, tol: float) -> list[Reason]:
    """6. TP scaling must not invert: a larger TP slower than TP1 (beyond tolerance)."""
    out = []
    labels = {label for _, label in decode}
    for label in labels:
        one = decode.get((1, label))
        if one is None:
            continue
        for (tp, lb), m in sorted(decode.items()):
            if lb != label or tp <= 1:
                continue
            if m.tok_s < one.tok_s * (1 - tol):
                out.append(
                    _reason(
                        DEGRADED,
                        m.key,
                        f"TP scaling inverts for {label}: TP{tp} {m.tok_s:.1f} tok/s < TP1 "
                        f"{one.tok_s:.1f} tok/s",
                        m.tok_s,
                        one.tok_s,
                    )
                )
    return out


def exit_code(verdict: dict[str, Any]) -> int:
    return 0 if verdict.get("status") == HEALTHY else 1
