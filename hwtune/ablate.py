"""Ablation: what each tuning gives on its own, with repeats and a 95% confidence interval.

The seed measured its tunings together (+7.5% / +18.5%) and never one by one. Here every NCCL
variable of a profile is toggled on its own against NCCL's defaults ("+K": baseline plus K only)
and taken out of the full profile ("all-K"), next to "none" and "all". Each arm runs in its own
child process (NCCL reads its variables once per process), arms rotate every repeat, and the
NVLink-multicast safety is forced in every child (hwtune/nccl_compare.run_arms).

MaxReadReq and NUMA balancing are host settings: this module measures only what a process can
toggle for itself (NCCL variables); a box whose host gpubox may change gets those rows from the
health benchmark (`gpubox tune ablate BOX`), a machine lent read-only does not, and the table says so.

Metrics: all-reduce busbw per (TP set, size), from gpubox.hwtune/probe.py in each child.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping

from .nccl_compare import SAFETY_ENV, child_env, probe_argv, run_arms

SCHEMA = "gpubox.ablation/1"
# Variables that change logging, not what NCCL does: not ablated (a row would only measure noise).
NOT_TUNING = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}
# Two-sided 95% Student t quantiles by degrees of freedom (standard table); >= 30 -> 1.96 region.
T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def t95(df: int) -> float:
    if df < 1:
        return math.inf
    keys = [k for k in sorted(T95) if k <= df]
    return T95[keys[-1]] if df < 30 else 1.96


def arms_for(profile_env: Mapping[str, str], leave_one_out: bool = True) -> dict[str, dict[str, str]]:
    """Arm name -> the profile variables it sets (none, +K for each K, all-K for each K, all)."""
    knobs = {k: str(v) for k, v in profile_env.items() if k not in NOT_TUNING and k not in SAFETY_ENV}
    arms: dict[str, dict[str, str]] = {"none": {}}
    for k, v in knobs.items():
        arms[f"+{k}"] = {k: v}
    if leave_one_out and len(knobs) > 1:
        for k in knobs:
            arms[f"all-{k}"] = {j: w for j, w in knobs.items() if j != k}
    arms["all"] = dict(knobs)
    return arms


def mean_ci(vals: list[float]) -> tuple[float | None, float | None]:
    """(mean, half-width of the 95% CI); half-width None with fewer than 2 values."""
    if not vals:
        return None, None
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, None
    return m, t95(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))


def delta_ci(a: list[float], base: list[float]) -> tuple[float | None, float | None]:
    """(mean(a)/mean(base) - 1, 95% CI half-width) in percent, Welch standard error with the
    conservative df = min(n) - 1."""
    if not a or not base:
        return None, None
    ma, mb = statistics.fmean(a), statistics.fmean(base)
    if not mb:
        return None, None
    d = 100.0 * (ma / mb - 1)
    if len(a) < 2 or len(base) < 2:
        return d, None
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(base) / len(base))
    return d, 100.0 * t95(min(len(a), len(base)) - 1) * se / mb


def metrics_of(doc: Mapping[str, Any]) -> dict[str, float]:
    """'allreduce TP2 [0,1] 1 MiB' -> busbw GB/s, from one probe document."""
    from .nccl_gate import _size

    out = {}
    for p in (doc.get("bandwidth") or {}).get("probes") or []:
        if p.get("name") == "allreduce" and p.get("status") == "ok" and p.get("busbw_gbps") is not None:
            g = p.get("gpus") or []
            out[f"allreduce TP{len(g)} [{','.join(map(str, g))}] {_size(int(p.get('bytes') or 0))}"] = float(
                p["busbw_gbps"]
            )
    return out


def table(
    arm_docs: Mapping[str, list[Mapping[str, Any]]], arm_env: Mapping[str, Mapping[str, str]]
) -> list[dict]:
    """One row per (arm, metric): runs, mean, CI, and the change against "none" with its CI."""
    per: dict[str, dict[str, list[float]]] = {}
    for arm, docs in arm_docs.items():
        for d in docs:
            for m, v in metrics_of(d).items():
                per.setdefault(arm, {}).setdefault(m, []).append(v)
    metrics = sorted({m for v in per.values() for m in v})
    rows = []
    for m in metrics:
        base = per.get("none", {}).get(m, [])
        for arm in arm_docs:
            vals = per.get(arm, {}).get(m, [])
            mean, ci = mean_ci(vals)
            d, dci = delta_ci(vals, base) if arm != "none" else (0.0, None)
            sig = (
                None
                if dci is None or d is None
                else ("faster" if d - dci > 0 else "slower" if d + dci < 0 else "ns")
            )
            rows.append(
                {
                    "metric": m,
                    "arm": arm,
                    "env": dict(arm_env.get(arm, {})),
                    "runs": vals,
                    "mean": None if mean is None else round(mean, 2),
                    "ci95": None if ci is None else round(ci, 2),
                    "delta_pct": None if d is None else round(d, 2),
                    "delta_ci95_pct": None if dci is None else round(dci, 2),
                    "significant": sig,
                }
            )
    return rows


def run(
    profile,
    sets: list[dict],
    *,
    sizes: list[int],
    repeats: int = 3,
    quick: bool = True,
    python: str,
    base_env: Mapping[str, str],
    timeout: float = 120.0,
    leave_one_out: bool = True,
    child=None,
) -> dict:
    """Measure every arm `repeats` times (rotated order) and tabulate."""
    arm_env = arms_for(profile.env, leave_one_out)
    envs = {a: child_env(base_env, e)[0] for a, e in arm_env.items()}
    argv = probe_argv(python, [s["gpus"] for s in sets], sizes, quick)
    docs = run_arms(envs, argv, repeats, timeout, child=child) if sets else {a: [] for a in envs}
    errors = [f"{a}: {d['error']}" for a, ds in docs.items() for d in ds if "error" in d]
    skipped = [k for k in profile.env if k in NOT_TUNING]
    return {
        "schema": SCHEMA,
        "profile": profile.name,
        "profile_env": dict(profile.env),
        "sets": sets,
        "sizes": sizes,
        "repeats": repeats,
        "quick": quick,
        "arms": arm_env,
        "child_env": {a: [d.get("env") for d in ds] for a, ds in docs.items()},
        "rows": table(docs, arm_env),
        "errors": errors,
        "not_ablated": [f"{k}: logging only" for k in skipped],
        "host_settings": "MaxReadReq and NUMA balancing not toggled: host settings (read-only here)",
    }


def plot(result: Mapping[str, Any], path: str) -> str:
    """Bar chart of each arm's change against "none" with its 95% CI, one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(dict.fromkeys(r["metric"] for r in result["rows"]))
    fig, axes = plt.subplots(len(metrics) or 1, 1, figsize=(8, 2.4 * max(1, len(metrics))), squeeze=False)
    for ax, m in zip(axes[:, 0], metrics):
        rows = [
            r
            for r in result["rows"]
            if r["metric"] == m and r["arm"] != "none" and r["delta_pct"] is not None
        ]
        ax.barh(
            [r["arm"] for r in rows],
            [r["delta_pct"] for r in rows],
            xerr=[r["delta_ci95_pct"] or 0 for r in rows],
            color=["tab:green" if r["delta_pct"] >= 0 else "tab:red" for r in rows],
            capsize=3,
        )
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("% change vs NCCL defaults (95% CI)", fontsize=8)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"ablation of {result['profile']} ({result['repeats']} repeats)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def render(result: Mapping[str, Any], con) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(
        title=f"ablation of {escape(result['profile'])}: busbw GB/s, mean +/- 95% CI "
        f"({result['repeats']} repeats)"
    )
    for col in ("metric", "arm", "mean", "+/-", "vs none %", "+/- %", "verdict"):
        t.add_column(col, justify="right" if col not in ("metric", "arm", "verdict") else "left")
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in result["rows"]:
        t.add_row(
            escape(r["metric"]),
            escape(r["arm"]),
            f(r["mean"]),
            f(r["ci95"]),
            f(r["delta_pct"]),
            f(r["delta_ci95_pct"]),
            r["significant"] or "",
        )
    con.print(t)
    for line in [*result.get("not_ablated", []), result.get("host_settings"), *result.get("errors", [])]:
        if line:
            con.print(f"[dim]{escape(line)}[/]")


def table_md(result: dict) -> str:
    """The ablation as a Markdown table (docs quote it as is)."""
    lines = [
        f"Ablation of `{result['profile']}`: all-reduce busbw GB/s, mean ± 95% CI over "
        f"{result['repeats']} repeats; change against NCCL's defaults (`none`).",
        "",
        "| metric | arm | mean | ±CI | vs none | ±CI | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    f = lambda v, s="": "-" if v is None else f"{v:.2f}{s}"  # noqa: E731
    for r in result["rows"]:
        lines.append(
            f"| {r['metric']} | {r['arm']} | {f(r['mean'])} | {f(r['ci95'])} | {f(r['delta_pct'], '%')} "
            f"| {f(r['delta_ci95_pct'], '%')} | {r['significant'] or ''} |"
        )
    lines += ["", *(f"- {x}" for x in result.get("not_ablated", [])), f"- {result.get('host_settings')}"]
    return "\n".join(lines) + "\n"
