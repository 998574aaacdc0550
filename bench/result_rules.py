"""The rules a result document must meet besides being readable (bench.result_model): before
gpubox writes one (every key present, a reason for what did not run, a figure for what did) and
before the history store records one (names its box, run and start; a box_id that is a box
identity). Kept apart from the model so the model stays the shape and its reading.
"""

from __future__ import annotations

from typing import Any

from gpubox.errors import GpuboxError

from .result_model import BOX_ID_RE, BenchResult
from .result_read import SCHEMA, STATUSES, VERDICTS, WORKLOADS


def write_problems(doc: dict[str, Any]) -> list[str]:
    """Problems with a document gpubox is about to write, [] when none: the read rules
    (BenchResult.problem) and what a written document must hold besides (every top-level key,
    every server and measurement key, a reason for what did not run, a figure for what did)."""
    errs: list[str] = []
    typed = BenchResult.problem(doc)
    if typed:
        errs.append(typed)
    if doc.get("schema") != SCHEMA:
        errs.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for k in (
        "box",
        "run_id",
        "started_at",
        "profile",
        "tool",
        "facts",
        "servers",
        "measurements",
        "verdict",
    ):
        if k not in doc:
            errs.append(f"missing key {k!r}")
    for i, s in enumerate(doc.get("servers", [])):
        for k in ("tp", "method", "label", "command", "env", "status"):
            if k not in s:
                errs.append(f"servers[{i}] missing {k!r}")
        if s.get("status") not in STATUSES:
            errs.append(f"servers[{i}].status {s.get('status')!r} not in {STATUSES}")
    keys = set()
    for i, m in enumerate(doc.get("measurements", [])):
        where = f"measurements[{i}] ({m.get('key')})"
        for k in ("key", "tp", "method", "label", "workload", "status", "tok_s", "acceptance", "samples"):
            if k not in m:
                errs.append(f"{where} missing {k!r}")
        if m.get("key") in keys:
            errs.append(f"{where}: duplicate key")
        keys.add(m.get("key"))
        if m.get("workload") not in WORKLOADS:
            errs.append(f"{where}: workload {m.get('workload')!r} not in {WORKLOADS}")
        st = m.get("status")
        if st not in STATUSES:
            errs.append(f"{where}: status {st!r} not in {STATUSES}")
        if st in ("failed", "skipped"):
            if not m.get("reason"):
                errs.append(f"{where}: {st} without a reason")
            for k in ("tok_s", "aggregate_tok_s", "ttft_s", "tpot_ms"):
                if m.get(k) not in (None,):
                    errs.append(f"{where}: {st} but {k} is {m.get(k)!r} (must be null, never zero)")
        if st == "ok" and m.get("workload") != "concurrency" and not m.get("tok_s"):
            errs.append(f"{where}: ok without tok_s")
    v = doc.get("verdict") or {}
    if v.get("status") not in VERDICTS:
        errs.append(f"verdict.status {v.get('status')!r} not in {VERDICTS}")
    return errs


def record_check(doc: Any, where: str = "result document") -> BenchResult:
    """DOC as a run the history store may record: it follows the schema, names its box, run and
    start (not empty), and its box_id, when set, is a box identity. GpuboxError otherwise."""
    res = BenchResult.check(doc, where)
    for k in ("box", "run_id", "started_at"):
        if not doc.get(k):
            raise GpuboxError(f"result document has no {k!r}", "it must name box, run_id and started_at")
    bid = doc.get("box_id")
    if bid is not None and not BOX_ID_RE.match(bid):
        raise GpuboxError(
            f"result document's box_id {bid!r} is not a box identity", "see docs/result-schema.md"
        )
    return res
