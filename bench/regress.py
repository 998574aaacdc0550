"""Regression detection: is this run slower than the box's own recent past, or than expected?

A measurement is degraded when its headline figure (tok/s; aggregate tok/s under concurrency)
falls below
- the median of the same key over the last `window` healthy runs by more than `tolerance`
  (needs at least `min_runs` such runs; the median shrugs off one odd run), or
- the inventory expectation `gpubox_bench.expect.tok_s.tp<N>.<label>` by more than
  `expect.tolerance` (single-stream decode only: that is what the expectation describes).

A drop is *sustained* when this run and the `sustained - 1` runs before it were all below the
same threshold, else *one-off*. Degraded runs never enter the baseline, so a sustained drop keeps
being reported instead of quietly becoming the new normal.

Settings (inventory, all optional):

    gpubox_bench:
      regress: {window: 5, tolerance: 0.10, sustained: 3, min_runs: 3}
      expect: {tolerance: 0.10, tok_s: {tp8: {"ddtree:15": 263.9}}}
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable

from gpubox.errors import GpuboxError

from . import history
from .result_model import BenchResult, Measurement, Reason, Verdict

HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"
LEVELS = {HEALTHY: 0, DEGRADED: 1, FAILED: 2}


@dataclass
class Settings:
    window: int = 5
    tolerance: float = 0.10
    sustained: int = 3
    min_runs: int = 3
    expect: dict[str, Any] | None = None
    expect_tolerance: float = 0.10

    def __post_init__(self):
        for name in ("window", "sustained", "min_runs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GpuboxError(
                    f"gpubox_bench.regress.{name} = {v!r} is not a positive whole number",
                    f"set e.g. {name}: {Settings.__dataclass_fields__[name].default}",
                )
        for name in ("tolerance", "expect_tolerance"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1:
                raise GpuboxError(
                    f"{name.replace('_', '.')} = {v!r} is not a fraction in [0, 1)", "write 10% as 0.10"
                )


def settings_from_box(box) -> Settings:
    """Settings from a gpubox.inventory.Box (its gpubox_bench variable)."""
    bench = box.var("gpubox_bench") or {}
    if not isinstance(bench, dict):
        raise GpuboxError(f"box {box.name}: gpubox_bench is not a mapping", "see inventory/example.yml")
    reg = bench.get("regress") or {}
    expect = bench.get("expect") or {}
    if not isinstance(reg, dict) or not isinstance(expect, dict):
        raise GpuboxError(
            f"box {box.name}: gpubox_bench.regress/expect must be mappings", "see docs/schedule.md"
        )
    exp_tol = expect.get("tolerance", 0.10)
    return Settings(
        window=reg.get("window", 5),
        tolerance=reg.get("tolerance", exp_tol),
        sustained=reg.get("sustained", 3),
        min_runs=reg.get("min_runs", 3),
        expect=expect.get("tok_s") or None,
        expect_tolerance=exp_tol,
    )


def _describe(m: Measurement) -> str:
    tp = m.tp
    label = m.label or m.method or "?"
    work = m.workload or ""
    extra = f" out{m.output_len}" if m.output_len else ""
    if m.workload == "concurrency" and m.concurrency:
        extra += f" C={m.concurrency}"
    return f"TP{tp} {label} {work}{extra}".strip()


def _expected(settings: Settings, m: Measurement) -> float | None:
    """The inventory's expectation for a single-stream decode measurement, if any."""
    if not settings.expect or m.workload != "decode" or (m.concurrency or 1) != 1:
        return None
    per_tp = settings.expect.get(f"tp{m.tp}") or {}
    for name in (m.label, m.method):
        if name in per_tp and isinstance(per_tp[name], (int, float)):
            return float(per_tp[name])
    return None


def _prior(doc: dict[str, Any], runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs before DOC (the store may already hold DOC itself), same kind (simulated or not)."""
    started = str(doc.get("started_at", ""))
    sim = bool(doc.get("simulated"))
    return [
        r
        for r in runs
        if r.get("run_id") != doc.get("run_id")
        and str(r.get("started_at", "")) < started
        and bool(r.get("simulated")) == sim
    ]


def _streak(prior: list[dict[str, Any]], key: str, field: str, threshold: float) -> int:
    """How many of the most recent prior runs in a row were below THRESHOLD for KEY."""
    n = 0
    for r in reversed(prior):
        v = history.value(r, key, field)
        if v is None or v >= threshold:
            break
        n += 1
    return n


def decide(
    doc: dict[str, Any], runs: Iterable[dict[str, Any]] = (), settings: Settings | None = None
) -> dict[str, Any]:
    """The history/expectation verdict of DOC against earlier RUNS (schema's `verdict` shape)."""
    settings = settings or Settings()
    prior = _prior(doc, runs)
    reasons: list[Reason] = []
    for m in BenchResult.view(doc).measurements:
        key = m.key
        if not key:
            continue
        status = m.status or "ok"
        if status == "failed":
            reasons.append(
                Reason.build(
                    level=FAILED,
                    kind="measurement",
                    key=key,
                    message=f"{_describe(m)} failed: {m.reason or 'no reason given'}",
                    observed=None,
                    expected=None,
                )
            )
            continue
        if status != "ok":
            continue
        field = m.headline_field
        observed = history.value(doc, key, field)
        if observed is None:
            continue
        base, used = history.baseline_of(prior, key, settings.window, field)
        if base is not None and len(used) >= settings.min_runs and base > 0:
            threshold = base * (1 - settings.tolerance)
            if observed < threshold:
                drop = (base - observed) / base
                runs_below = 1 + _streak(prior, key, field, threshold)
                pattern = "sustained" if runs_below >= settings.sustained else "one-off"
                tail = (
                    f"sustained: {runs_below} runs in a row"
                    if pattern == "sustained"
                    else "one-off"
                    if runs_below == 1
                    else f"one-off so far: {runs_below} runs in a row"
                )
                reasons.append(
                    Reason.build(
                        level=DEGRADED,
                        kind="history",
                        key=key,
                        field=field,
                        message=(
                            f"{_describe(m)} {observed:.1f} tok/s is {drop:.1%} below the median "
                            f"{base:.1f} of the last {len(used)} healthy runs "
                            f"(tolerance {settings.tolerance:.0%}); {tail}"
                        ),
                        observed=observed,
                        expected=round(base, 3),
                        baseline=round(base, 3),
                        baseline_runs=used,
                        drop=round(drop, 4),
                        pattern=pattern,
                        runs_below=runs_below,
                    )
                )
        exp = _expected(settings, m)
        if exp is not None and exp > 0 and observed < exp * (1 - settings.expect_tolerance):
            drop = (exp - observed) / exp
            reasons.append(
                Reason.build(
                    level=DEGRADED,
                    kind="expectation",
                    key=key,
                    field=field,
                    message=(
                        f"{_describe(m)} {observed:.1f} tok/s is {drop:.1%} below the expected "
                        f"{exp:.1f} (tolerance {settings.expect_tolerance:.0%})"
                    ),
                    observed=observed,
                    expected=exp,
                    drop=round(drop, 4),
                )
            )
    status = max((r.level for r in reasons), key=LEVELS.get, default=HEALTHY)
    return Verdict.build(status=status, reasons=reasons).to_dict()


def merge(own: dict[str, Any] | None, other: dict[str, Any]) -> dict[str, Any]:
    """Combine the benchmark's own verdict with OTHER (worst status; reasons once each).

    The benchmark may already have judged expectations; a reason for the same key and expected
    figure is not repeated."""
    own = copy.deepcopy(own or {"status": HEALTHY, "reasons": []})
    reasons = list(own.get("reasons") or [])
    seen = {(r.get("key"), _round(r.get("expected")), r.get("level")) for r in reasons}
    for r in other.get("reasons") or []:
        sig = (r.get("key"), _round(r.get("expected")), r.get("level"))
        if sig in seen:
            continue
        seen.add(sig)
        reasons.append(r)
    statuses = [own.get("status") or HEALTHY, other.get("status") or HEALTHY]
    statuses = [s if s in LEVELS else FAILED for s in statuses]
    own["status"] = max(statuses, key=LEVELS.get)
    own["reasons"] = reasons
    return own


def _round(v):
    return round(float(v), 1) if isinstance(v, (int, float)) else v


def with_verdict(
    doc: dict[str, Any], runs: Iterable[dict[str, Any]] = (), settings: Settings | None = None
) -> dict[str, Any]:
    """DOC with its verdict merged with the history/expectation verdict (a copy)."""
    out = copy.deepcopy(doc)
    out["verdict"] = merge(doc.get("verdict"), decide(doc, runs, settings))
    return out
