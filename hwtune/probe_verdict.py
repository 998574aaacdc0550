"""Judge a probe document (hwtune/probe.py's JSON) against limits: one check per GPU and path.

The probe runs on the target and only measures; the verdict runs on the control node, so CI tests
it on output recorded from a real H200 (tests/fixtures/probe/h200_real.json). The document is read
through its model (probe_doc.ProbeDoc); the checks are in probe_gpu_checks.py (each GPU's facts)
and probe_bandwidth_checks.py (the figures and the paths); the limits in probe_limits.py.

Statuses: ok; drift = measurably degraded (a link at x8, copies below the limit, a reset pending);
failed = broken (a probe crashed, a GPU missing, row remapping out of spares); skipped = could not
measure here (no NVML, no GPU, no torch), which is not a problem in itself.
"""

from __future__ import annotations

from typing import Any

from gpubox.steps import RunReport

from .probe_bandwidth_checks import check_bandwidth, check_paths
from .probe_check import Check, summarize
from .probe_doc import PROBE_SCHEMA, ProbeDoc
from .probe_doc import parse as parse_doc
from .probe_gpu_checks import (
    check_clocks,
    check_fabric,
    check_link,
    check_memory,
    check_nvml,
    check_state,
    check_xid,
)
from .probe_limits import (
    DEFAULTS,
    KNOWN_GPUS,
    PCIE_LANE_GBPS,
    expected_link,
    limits,
    link_rate,
    mem_spec_tbs,
    tp_sets,
)

REPORT_SCHEMA = "gpubox.probe-report/1"

# What callers of the verdict import from here (the CLI, the probe step, tests).
__all__ = [
    "DEFAULTS",
    "KNOWN_GPUS",
    "PCIE_LANE_GBPS",
    "PROBE_SCHEMA",
    "REPORT_SCHEMA",
    "Check",
    "ProbeDoc",
    "gpu_table",
    "decide",
    "limits",
    "link_rate",
    "mem_spec_tbs",
    "parse",
    "report",
    "summarize",
    "tp_sets",
]


def parse(text: str, source: str = "probe") -> dict[str, object]:
    """The probe's stdout -> its document as JSON, checked against the model on the way (for
    callers that carry the mapping itself; probe_doc.parse gives the model)."""
    return parse_doc(text, source).to_json()


def decide(
    doc: ProbeDoc | dict, lim: dict[str, Any] | None = None, *, expect_gpus: int | None = None
) -> list[Check]:
    doc = ProbeDoc.of(doc)
    lim = lim or limits()
    out = check_nvml(doc, lim, expect_gpus)
    for g in doc.gpus:
        if g.error:
            continue
        out += [check_state(g, lim), check_link(doc, g, lim), check_memory(g), check_clocks(doc, g)]
    fabric = check_fabric(doc)
    if fabric is not None:
        out.append(fabric)
    out += check_paths(doc)
    out += check_bandwidth(doc, lim)
    out.append(check_xid(doc))
    return out


def gpu_table(doc: ProbeDoc | dict, lim: dict[str, Any] | None = None) -> list[dict[str, object]]:
    """One row of headline figures per GPU, for people (and the report's `gpus`)."""
    doc = ProbeDoc.of(doc)
    lim = lim or limits()
    rows = []
    for g in doc.gpus:
        if g.error:
            continue
        pc = g.pcie
        ref, _ = expected_link(g, lim)
        row: dict[str, object] = {
            "gpu": g.index,
            "name": g.name,
            "bus_id": g.bus_id,
            "link": f"Gen{pc.gen_current} x{pc.width_current} / Gen{pc.gen_max} x{pc.width_max}",
            "link_gbps": ref,
        }
        for p in doc.probes:
            if p.bus_id == g.bus_id and p.status == "ok" and p.name in ("h2d", "d2h", "d2d"):
                row[f"{p.name}_gbps"] = p.gbps
                if p.name == "h2d" and p.link_under_load:
                    lu = p.link_under_load
                    row["link"] = f"Gen{lu.gen} x{lu.width} / Gen{pc.gen_max} x{pc.width_max}"
        tbs = mem_spec_tbs(g.name, lim.get("mem_bw_tbs"))
        row["mem_spec_gbps"] = tbs * 1000 if tbs else None
        rows.append(row)
    return rows


def report(
    doc: ProbeDoc | dict,
    lim: dict[str, Any] | None = None,
    *,
    box: str = "-",
    host: str = "-",
    expect_gpus: int | None = None,
) -> RunReport:
    """The probe as a RunReport: one row per check; the raw document travels along for machines."""
    doc = ProbeDoc.of(doc)
    lim = lim or limits()
    checks = decide(doc, lim, expect_gpus=expect_gpus)
    rep = RunReport(box=box, mode="check", steps=[c.to_result(host) for c in checks])
    rep.seconds = float(doc.seconds or 0.0)
    rep.extra = {
        "schema": REPORT_SCHEMA,
        "gpus": gpu_table(doc, lim),
        "thresholds": {k: v for k, v in lim.items() if k not in ("python", "timeout_s")},
        "probe": doc.to_json(),
    }
    return rep
