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

import json
import re
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError

SCHEMA = "gpubox.bench/1"
HISTORY_SCHEMA = "gpubox.history/1"
STATUSES = ("ok", "failed", "skipped")
WORKLOADS = ("decode", "concurrency", "long_context", "agentic")
VERDICTS = ("healthy", "degraded", "failed")
MAX_BYTES = 256 << 20  # a result with every raw sample is a few MiB
MAX_DEPTH = 24  # the schema nests 5 deep; facts/client notes a few more
MAX_INT = 2**63 - 1
MAX_STR = 1 << 20
SCHEMA_RE = re.compile(r"^gpubox\.bench/(\d+)$")


class ResultError(GpuboxError):
    """A result document or history line that breaks the schema (exit 2, names file and field)."""


def problem(doc: Any) -> str | None:
    """The first way DOC breaks the schema (field path and what is wrong), or None."""
    from .result_model import BenchResult

    return BenchResult.problem(doc)


def check(doc: Any, where: str) -> dict[str, Any]:
    """DOC when it follows the schema; else ResultError naming WHERE and the field."""
    p = problem(doc)
    if p:
        raise ResultError(f"{where}: {p}", "give a result written by `gpubox bench` (docs/result-schema.md)")
    return doc


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"integer with {len(text.lstrip('-'))} digits")
    return int(text)


def parse(text: str | bytes, where: str) -> Any:
    """JSON with bounded integers and depth; ResultError naming WHERE. NaN/Infinity are refused
    by check(), which names their field."""
    try:
        # NaN/Infinity parse (as Python's json does) so that check() can name their field.
        return json.loads(text, parse_int=_int)
    except RecursionError:
        raise ResultError(f"{where}: nested too deeply", "give a result written by `gpubox bench`") from None
    except json.JSONDecodeError as exc:
        raise ResultError(
            f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            "give a result written by `gpubox bench`",
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultError(f"{where}: {exc}", "give a result written by `gpubox bench`") from None


def read_text(path: str | Path) -> str:
    """One result file's text, bounded and UTF-8; ResultError naming the file."""
    from gpubox.errors import os_error

    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise ResultError(f"{p}: is a directory", "name the result JSON file itself") from None
    except FileNotFoundError:
        raise ResultError(f"{p}: no such file", "check the path of the result JSON") from None
    except OSError as exc:
        raise os_error(exc) from None
    if len(data) > MAX_BYTES:
        raise ResultError(f"{p}: larger than {MAX_BYTES >> 20} MiB", "give one result document")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        from gpubox.errors import not_utf8

        raise not_utf8(f"result {p}", data, exc) from None


def load(path: str | Path) -> dict[str, Any]:
    """Read, parse and check one result file (bench.result_model.BenchResult); ResultError naming
    the file and field."""
    from .result_model import BenchResult

    return BenchResult.load(path).to_dict()


def history_line(line: str, where: str) -> dict[str, Any]:
    """The document of one history store line, checked; ResultError naming WHERE (file:line)."""
    from .result_model import HistoryRecord

    return HistoryRecord.from_line(line, where).doc.to_dict()
