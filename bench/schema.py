"""The typed result: one schema for the benchmark result document (`gpubox.bench/1`) and the
history line that carries it (`gpubox.history/1`), checked when a document is LOADED, by every
reader (report, history, doctor's latest result, schedule run-once, the Prometheus export).

Before, the schema string was defined three times and checked by three functions, each of which
let through what the next reader choked on: NaN/Infinity (Python's json accepts them), strings
where numbers belong, lists where strings belong, 100,000-deep nesting (RecursionError), a
5,000-digit integer (ValueError from int()), a `gpubox.bench/2` document listed as a current run.

The shape is declared once, as typed models (bench.result_model: `BenchResult` and its parts,
`HistoryRecord`); this module holds the reading rules around them (strict parsing, size and depth
bounds) and the entry points every reader uses: `load(path)`, `check(doc, where)`,
`history_line(line, where)`. The first problem is one ResultError naming the file (or store line)
and the field path, e.g. `results/x.json: measurements[3].tok_s: NaN is not a finite number`.
Fields the schema does not declare are kept as they are (forward-compatible additions), but
bounded in depth and size. docs/result-schema.md is generated from the models
(`python -m gpubox.bench.schema_doc`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .result_model import BenchResult, HistoryRecord
from .result_read import (  # noqa: F401 - the names readers import from bench.schema
    HISTORY_SCHEMA,
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT,
    MAX_STR,
    SCHEMA,
    SCHEMA_RE,
    STATUSES,
    VERDICTS,
    WORKLOADS,
    ResultError,
    parse,
    read_text,
)


def problem(doc: Any) -> str | None:
    """The first way DOC breaks the schema (field path and what is wrong), or None."""
    return BenchResult.problem(doc)


def check(doc: Any, where: str) -> dict[str, Any]:
    """DOC when it follows the schema; else ResultError naming WHERE and the field."""
    p = problem(doc)
    if p:
        raise ResultError(f"{where}: {p}", "give a result written by `gpubox bench` (docs/result-schema.md)")
    return doc


def load(path: str | Path) -> dict[str, Any]:
    """Read, parse and check one result file (bench.result_model.BenchResult); ResultError naming
    the file and field."""
    return BenchResult.load(path).to_dict()


def history_line(line: str, where: str) -> dict[str, Any]:
    """The document of one history store line, checked; ResultError naming WHERE (file:line)."""
    return HistoryRecord.from_line(line, where).doc.to_dict()
