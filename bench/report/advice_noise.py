"""Noise of one figure: from a measurement's repetitions or from the box's earlier runs."""

from __future__ import annotations

import functools
import math
import statistics

from .advice_model import HISTORY_RUNS, MIN_HISTORY, Noise
from .data import Measurement, ResultDoc


@functools.lru_cache(maxsize=None)
def d2(n: int) -> float:
    """The expected range of n standard normal draws (the control-chart constant d2, Tippett 1925):
    integral of 1 - Phi(x)^n - (1 - Phi(x))^n over x, by Simpson's rule; d2(2) = 1.128,
    d2(3) = 1.693, d2(4) = 2.059. Computed rather than tabled so any repetition count works."""
    if n < 2:
        raise ValueError("d2 needs n >= 2")

    def f(x: float) -> float:
        phi = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        return 1 - phi**n - (1 - phi) ** n

    lo, hi, k = -10.0, 10.0, 4000
    h = (hi - lo) / k
    total = f(lo) + f(hi) + sum((4 if i % 2 else 2) * f(lo + i * h) for i in range(1, k))
    return total * h / 3


def repeat_noise(m: Measurement) -> Noise | None:
    """sd of one figure from the min/max spread over the measurement's repetitions. Fields are
    read by attribute (schema names) so a typed Measurement serves as well as the dict-backed one."""
    n, spread = getattr(m, "repetitions", None), getattr(m, "tok_s_spread", None)
    if not isinstance(n, int) or n < 2 or not isinstance(spread, list) or len(spread) != 2:
        return None
    lo, hi = spread
    if not all(isinstance(x, (int, float)) for x in (lo, hi)) or hi < lo:
        return None
    sd = (hi - lo) / d2(n)
    detail = f"spread of {n} repetitions"
    if m.workload == "concurrency":  # the spread is of per-request tok/s: scale it to the aggregate
        tok = getattr(m, "tok_s", None)
        if not isinstance(tok, (int, float)) or tok <= 0 or m.value is None:
            return None
        sd *= m.value / tok
        detail += " (per-request spread scaled to the aggregate)"
    return Noise(sd, "repeats", detail)


def history_noise(key: str, history: list[ResultDoc]) -> Noise | None:
    vals = []
    for r in history[-HISTORY_RUNS:]:
        if r.verdict.status != "healthy":
            continue  # a degraded run is a regression, not noise
        m = _by_key(r).get(key)
        if m is not None and m.value is not None:
            vals.append(m.value)
    if len(vals) < MIN_HISTORY:
        return None
    return Noise(statistics.stdev(vals), "history", f"{len(vals)} earlier healthy runs of the box")


def _by_key(r: ResultDoc) -> dict:
    """A run's measurements by key, built once per run: a lookup per measurement by scanning the
    earlier run made advise quadratic in the number of measurements."""
    index = r.__dict__.get("_advice_by_key")
    if index is None or index[0] is not r.measurements:
        by: dict = {}
        for x in r.measurements:
            by.setdefault(x.key, x)  # the first with that key, as the scan found it
        index = r.__dict__["_advice_by_key"] = (r.measurements, by)
    return index[1]


def point_noise(m: Measurement, history: list[ResultDoc]) -> Noise:
    found = [n for n in (repeat_noise(m), history_noise(m.key, history)) if n is not None]
    if not found:
        reps = getattr(m, "repetitions", None)
        have = (
            f"{reps} repetition" + ("s" if reps != 1 else "") if isinstance(reps, int) else "no repetitions"
        )
        return Noise(None, "none", f"{have}, fewer than {MIN_HISTORY} earlier healthy runs of the box")
    top = max(found, key=lambda n: n.sd)
    if len(found) == 2:
        other = found[1] if top is found[0] else found[0]
        top = Noise(top.sd, top.source, f"{top.detail}; larger than {other.source} ({other.sd:.2f})")
    return top
