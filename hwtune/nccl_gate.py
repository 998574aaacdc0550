"""A/B gate for an NCCL profile: install it only where it is not slower than NCCL's own tuning.

Input: a comparison document (hwtune/nccl_compare.py, schema gpubox.nccl-compare/1) with a
baseline arm, a profile arm and, when measured, an A/A arm (the baseline run again). The noise
floor of a row is the larger of `min_noise`, the A/A difference and the spread of the baseline's
own rounds; a row whose profile/baseline ratio falls below 1 - noise is "slower". One slower row
refuses the profile (a tool that tunes production boxes must never make one slower); a profile
that does not fit the box's topology class is refused too; a profile faster beyond noise
somewhere and slower nowhere passes; a profile within noise everywhere gains nothing and is not
installed either (NCCL's defaults stay: less to go wrong after upgrades).
"""

from __future__ import annotations

from typing import Any, Mapping

from gpubox.errors import GpuboxError

MIN_NOISE = 0.02  # 2%: below this, run-to-run jitter of NCCL busbw on an idle box (A/A runs)
PASS, REFUSE, NO_GAIN = "install", "refuse", "no-gain"


def _size(n: int) -> str:
    for unit, sh in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << sh and n % (1 << sh) == 0:
            return f"{n >> sh} {unit}"
    return f"{n} B"


def row_noise(row: Mapping[str, Any], min_noise: float = MIN_NOISE) -> tuple[float, str]:
    """(relative noise floor, where it came from) for one (TP set, size) row."""
    parts = [(min_noise, f"minimum {min_noise:.0%}")]
    b, aa = row.get("baseline"), row.get("baseline_aa")
    if b and aa:
        parts.append((abs(aa - b) / b, f"A/A {b:.1f} vs {aa:.1f} GB/s"))
    runs = [v for v in (row.get("baseline_runs") or []) + (row.get("baseline_aa_runs") or []) if v]
    if len(runs) >= 2:
        mid = sorted(runs)[len(runs) // 2]
        parts.append(
            ((max(runs) - min(runs)) / mid / 2, f"baseline rounds {min(runs):.1f}..{max(runs):.1f} GB/s")
        )
    return max(parts, key=lambda p: p[0])


def decide_row(row: Mapping[str, Any], min_noise: float = MIN_NOISE) -> dict[str, Any]:
    noise, src = row_noise(row, min_noise)
    b, p = row.get("baseline"), row.get("profile")
    where = (
        f"TP{row.get('tp')} [{','.join(map(str, row.get('gpus') or []))}] {_size(int(row.get('bytes') or 0))}"
    )
    out = {
        "tp": row.get("tp"),
        "gpus": row.get("gpus"),
        "bytes": row.get("bytes"),
        "baseline": b,
        "profile": p,
        "baseline_aa": row.get("baseline_aa"),
        "noise": round(noise, 4),
        "noise_from": src,
    }
    if not b or p is None:
        why = row.get("profile_reason") or row.get("baseline_reason") or "not measured"
        return {**out, "verdict": "unmeasured", "ratio": None, "detail": f"{where}: not measured ({why})"}
    ratio = p / b
    verdict = "slower" if ratio < 1 - noise else "faster" if ratio > 1 + noise else "same"
    detail = (
        f"{where}: {b:.1f} -> {p:.1f} GB/s (x{ratio:.2f}), noise +/-{noise:.1%} ({src}): "
        + {"slower": "slower beyond noise", "faster": "faster beyond noise", "same": "within noise"}[verdict]
    )
    return {**out, "verdict": verdict, "ratio": round(ratio, 3), "detail": detail}


def fits(profile_topologies: list[str] | None, box_class: str | None) -> bool | None:
    """None: cannot tell (no list in the profile, or the box's class is unknown)."""
    if not profile_topologies or not box_class or box_class == "unknown":
        return None
    return "any" in profile_topologies or box_class in profile_topologies


def decide(doc: Mapping[str, Any], min_noise: float = MIN_NOISE) -> dict[str, Any]:
    """The gate's verdict on a comparison document."""
    if not isinstance(doc, Mapping) or doc.get("schema") != "gpubox.nccl-compare/1" or "rows" not in doc:
        raise GpuboxError(
            "not a gpubox.nccl-compare/1 document",
            "give the JSON of `gpubox probe --local --nccl-compare P --json`",
        )
    rows = [decide_row(r, min_noise) for r in doc.get("rows") or []]
    slower = [r for r in rows if r["verdict"] == "slower"]
    faster = [r for r in rows if r["verdict"] == "faster"]
    unmeasured = [r for r in rows if r["verdict"] == "unmeasured"]
    fit = fits(doc.get("profile_topologies"), doc.get("topology_class"))
    reasons = []
    if fit is False:
        reasons.append(
            f"profile {doc.get('profile')} is for {', '.join(doc.get('profile_topologies') or [])}; "
            f"this box is {doc.get('topology_class')}"
        )
    if slower:
        reasons.append("slower beyond noise at " + "; ".join(r["detail"] for r in slower))
    if not rows or unmeasured:
        reasons.append("not measured: " + ("; ".join(r["detail"] for r in unmeasured) or "no TP set"))
    if reasons:
        verdict = REFUSE
    elif faster:
        verdict = PASS
        reasons.append(
            "faster beyond noise at " + "; ".join(r["detail"] for r in faster) + "; slower nowhere"
        )
    else:
        verdict = NO_GAIN
        reasons.append("within noise at every size: NCCL's own tuning stays (no variables)")
    aa = any(r.get("baseline_aa") is not None for r in rows)
    return {
        "schema": "gpubox.nccl-gate/1",
        "profile": doc.get("profile"),
        "verdict": verdict,
        "install": verdict == PASS,
        "fits_topology": fit,
        "topology_class": doc.get("topology_class"),
        "aa_measured": aa,
        "min_noise": min_noise,
        "rows": rows,
        "reasons": reasons,
        "summary": f"{doc.get('profile')}: {verdict} - " + " | ".join(reasons),
    }


def render(gate: Mapping[str, Any], con) -> None:
    """The gate's verdict, its rows and its reasons on a rich console (probe and tune nccl)."""
    from rich.markup import escape

    color = {"install": "green", "refuse": "red", "no-gain": "yellow"}[gate["verdict"]]
    con.print(
        f"[bold {color}]A/B gate: {escape(gate['profile'] or '?')}: {gate['verdict']}[/]"
        + ("" if gate["aa_measured"] else " [dim](no A/A arm: noise floor is the minimum only)[/]")
    )
    for r in gate["rows"]:
        con.print(f"  {r['verdict']:10} {escape(r['detail'])}")
    for why in gate["reasons"]:
        con.print(f"  [{color}]{escape(why)}[/]")
