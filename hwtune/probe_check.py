"""One judged row of the probe's verdict (`Check`), the percentage judgement most figures share,
and the step's one-line summary of a list of them.

Statuses: ok; drift = measurably degraded (a link at x8, copies below the limit, a reset pending);
failed = broken (a probe crashed, a GPU missing, row remapping out of spares); skipped = could not
measure here (no NVML, no GPU, no torch), which is not a problem in itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubox.steps import DRIFT, FAILED, OK, SKIPPED, StepResult

# A check's evidence: JSON values (records of the probe document as JSON, figures, labels).
Evidence = dict[str, object]


@dataclass
class Check:
    name: str
    status: str
    detail: str
    evidence: Evidence = field(default_factory=dict)
    cause: str | None = None
    repair: str | None = None

    def to_result(self, host: str) -> StepResult:
        return StepResult(
            name=self.name,
            host=host,
            status=self.status,
            detail=self.detail,
            evidence=self.evidence,
            cause=self.cause,
            repair=self.repair,
            title=self.name,
        )


def pct_check(
    name: str,
    value: float,
    ref: float | None,
    ref_label: str,
    min_pct: float,
    unit: str,
    ev: Evidence,
    what: str,
    cause: str,
    repair: str,
    scale: float = 1.0,
) -> Check:
    shown = f"{value / scale:.2f} {unit}" if scale != 1.0 else f"{value:.1f} {unit}"
    if not ref:
        return Check(
            name,
            SKIPPED,
            f"{shown}; no reference to judge against ({ref_label})",
            ev,
            repair="set gpubox_probe.mem_bw_tbs or link_gbps for this GPU",
        )
    pct = 100.0 * value / ref
    ev.update(value=value, reference=ref, pct=round(pct, 1), min_pct=min_pct)
    detail = f"{shown} = {pct:.0f}% of {ref_label}, min {min_pct:g}%"
    if pct < min_pct:
        return Check(name, DRIFT, f"{what} {detail}", ev, cause=cause, repair=repair)
    return Check(name, OK, detail, ev)


def summarize(checks: list[Check]) -> tuple[str, str, Evidence]:
    """(status, one-line detail, evidence) for a doctor/recover step: worst status wins."""
    bad = [c for c in checks if c.status in (DRIFT, FAILED)]
    if bad:
        st = FAILED if any(c.status == FAILED for c in bad) else DRIFT
        return (
            st,
            "; ".join(f"{c.name}: {c.detail}" for c in bad[:3])
            + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""),
            {"problems": [c.name for c in bad]},
        )
    ran = [c for c in checks if c.status == OK]
    if not ran:
        why = "; ".join(dict.fromkeys(c.detail for c in checks if c.status == SKIPPED))
        return SKIPPED, why or "nothing to probe", {}
    skipped = [c.name for c in checks if c.status == SKIPPED]
    return (
        OK,
        f"{len(ran)} checks ok" + (f", {len(skipped)} skipped" if skipped else ""),
        {"skipped": skipped},
    )
