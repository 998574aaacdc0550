"""The typed result: one schema for the benchmark result document (`gpubox.bench/1`) and the
history line that carries it (`gpubox.history/1`), checked when a document is LOADED, by every
reader (report, history, doctor's latest result, schedule run-once, the Prometheus export).

Before, the schema string was defined three times and checked by three functions, each of which
let through what the next reader choked on: NaN/Infinity (Python's json accepts them), strings
where numbers belong, lists where strings belong, 100,000-deep nesting (RecursionError), a
5,000-digit integer (ValueError from int()), a `gpubox.bench/2` document listed as a current run.

`load_bytes(data, where)` parses strictly and `check(doc, where)` walks the declared shape; the
first problem is one GpuboxError naming the file (or store line) and the field path, e.g.
`results/x.json: measurements[3].tok_s: NaN is not a finite number`. Fields the schema does not
declare are kept as they are (forward-compatible additions), but bounded in depth and size.
docs/result-schema.md documents the fields.
"""

from __future__ import annotations

import json
import math
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
_SCHEMA_RE = re.compile(r"^gpubox\.bench/(\d+)$")


class ResultError(GpuboxError):
    """A result document or history line that breaks the schema (exit 2, names file and field)."""


# -- the declared shape -------------------------------------------------------------------------
# A spec is a type name, or ("list", spec), or ("map", {field: spec}), or ("enum", values);
# a trailing "?" allows null.
NUM = "number?"
POS = "pos?"  # a rate or length that is divided by: > 0, and small enough that arithmetic stays finite
NONNEG = "nonneg?"  # a duration or a fraction: >= 0, bounded the same way
MAX_FIGURE = 1e12  # tok/s, seconds, milliseconds: far above any real figure, far below overflow
_PCT = ("map", {"p50": NONNEG, "p90": NONNEG, "p99": NONNEG, "mean": NONNEG})
MEASUREMENT = (
    "map",
    {
        "key": "str",
        "tp": "posint",
        "method": "str?",
        "budget": "int?",
        "label": "str",
        "workload": ("enum", WORKLOADS),
        "output_len": "int?",
        "concurrency": "int?",
        "context_tokens": "int?",
        "status": ("enum", STATUSES),
        "reason": "str?",
        "repetitions": "int?",
        "tok_s": POS,
        "tok_s_spread": ("list?", NONNEG),
        "aggregate_tok_s": POS,
        "ttft_s": _PCT + ("?",),
        "tpot_ms": _PCT + ("?",),
        "e2e_s": _PCT + ("?",),
        "tokens_per_chunk": POS,
        "errors": "int?",
        "acceptance": (
            "map",
            {
                "mean_length": POS,
                "rate": NONNEG,
                "per_position": ("list?", NONNEG),
                "drafts": "int?",
                "draft_tokens": "int?",
                "accepted": "int?",
            },
            "?",
        ),
        "samples": ("list?", ("map", {"rep": "int?", "ttft_s": NONNEG, "e2e_s": NONNEG, "error": "str?"})),
    },
)
SERVER = (
    "map",
    {
        "tp": "posint",
        "method": "str?",
        "budget": "int?",
        "label": "str",
        "gpus": ("list?", "int"),
        "command": ("list?", "str"),
        "env": ("map?", None),
        "status": ("enum", STATUSES),
        "error": "str?",
        "log_tail": "any",  # a string, or the log's last lines as a list
        "startup_s": NONNEG,
        "max_model_len": "int?",
    },
)
REASON = ("map", {"level": "str?", "key": "str?", "kind": "str?", "message": "str", "observed": "any"})
DOCUMENT = (
    "map",
    {
        "schema": "str",
        "box": "str",
        "box_id": "str?",
        "run_id": "str",
        "started_at": "str",
        "finished_at": "str?",
        "profile": "str?",
        "tool": ("map?", {"version": "str?", "git": "str?"}),
        "simulated": "bool?",
        "sim_speed": POS,
        "url": "str?",
        "facts": ("map?", None),
        "servers": ("list", SERVER),
        "measurements": ("list", MEASUREMENT),
        "verdict": ("map", {"status": ("enum", VERDICTS), "reasons": ("list?", REASON)}),
    },
)
REQUIRED = ("schema", "box", "run_id", "started_at")


_WORDS = {
    "str": "a string",
    "bool": "true or false",
    "int": "a whole number",
    "posint": "a whole number >= 1",
    "number": "a finite number",
    "pos": f"a number > 0 and <= {MAX_FIGURE:g}",
    "nonneg": f"a number >= 0 and <= {MAX_FIGURE:g}",
}


def _where(path: str) -> str:
    return path or "(document)"


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _bounded(v: Any, path: str, depth: int = 0) -> str | None:
    """Depth, size and finiteness of anything (declared or not)."""
    if depth > MAX_DEPTH:
        return f"{_where(path)}: nested deeper than {MAX_DEPTH} levels"
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return None if abs(v) <= MAX_INT else f"{_where(path)}: integer with {len(str(abs(v)))} digits"
    if isinstance(v, float):
        return None if math.isfinite(v) else f"{_where(path)}: {_const(v)} is not a finite number"
    if isinstance(v, str):
        return None if len(v) <= MAX_STR else f"{_where(path)}: a string of {len(v)} characters"
    if isinstance(v, list):
        for i, x in enumerate(v):
            p = _bounded(x, f"{path}[{i}]", depth + 1)
            if p:
                return p
        return None
    if isinstance(v, dict):
        for k, x in v.items():
            p = _bounded(x, f"{path}.{k}" if path else str(k), depth + 1)
            if p:
                return p
        return None
    return f"{_where(path)}: {type(v).__name__} is not JSON"


def _const(v: float) -> str:
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def _figure(v: Any) -> bool:
    """A number from a document that arithmetic may use (checked for its range by the caller)."""
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (not isinstance(v, float) or math.isfinite(v))
    )


def _check(v: Any, spec: Any, path: str) -> str | None:
    if spec is None or spec == "any":
        return None
    if isinstance(spec, str):
        opt = spec.endswith("?")
        t = spec.rstrip("?")
        if v is None:
            return None if opt else f"{_where(path)}: null, expected {_WORDS[t]}"
        ok = {
            "str": isinstance(v, str),
            "bool": isinstance(v, bool),
            "int": isinstance(v, int) and not isinstance(v, bool),
            "posint": isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            "pos": _figure(v) and 0 < v <= MAX_FIGURE,
            "nonneg": _figure(v) and 0 <= v <= MAX_FIGURE,
        }[t]
        if t in ("number", "pos", "nonneg") and isinstance(v, float) and not math.isfinite(v):
            return f"{_where(path)}: {_const(v)} is not a finite number"
        if not ok and t in ("pos", "nonneg") and _figure(v):  # a number out of range: say which bound
            return f"{_where(path)}: {_short(v)} is not {_WORDS[t]}"
        return None if ok else f"{_where(path)}: {_kind(v)} ({_short(v)}), expected {_WORDS[t]}"
    kind, inner, *rest = spec
    opt = kind.endswith("?") or (rest and rest[0] == "?")
    kind = kind.rstrip("?")
    if v is None:
        return None if opt else f"{_where(path)}: null, expected {kind if kind != 'map' else 'an object'}"
    if kind == "enum":
        return None if v in inner else f"{_where(path)}: {_short(v)} is not one of {', '.join(inner)}"
    if kind == "list":
        if not isinstance(v, list):
            return f"{_where(path)}: {_kind(v)}, expected a list"
        for i, x in enumerate(v):
            p = _check(x, inner, f"{path}[{i}]")
            if p:
                return p
        return None
    if kind == "map":
        if not isinstance(v, dict):
            return f"{_where(path)}: {_kind(v)}, expected an object"
        for k, sub in (inner or {}).items():
            if k in v:
                p = _check(v[k], sub, f"{path}.{k}" if path else k)
                if p:
                    return p
        return None
    raise ValueError(spec)


def _short(v: Any) -> str:
    from gpubox.escape import terminal

    return terminal(repr(v), limit=40)


def problem(doc: Any) -> str | None:
    """The first way DOC breaks the schema (field path and what is wrong), or None."""
    if not isinstance(doc, dict):
        return f"top level is {_kind(doc)}, not a result object"
    schema = doc.get("schema")
    if schema != SCHEMA:
        m = _SCHEMA_RE.match(schema) if isinstance(schema, str) else None
        if m and int(m.group(1)) > 1:
            return f"schema: {schema} is newer than this gpubox reads ({SCHEMA}); upgrade gpubox"
        return f"schema: {_short(schema)}, expected {SCHEMA!r}"
    for k in REQUIRED:
        if k not in doc:
            return f"{k}: missing"
    p = _bounded(doc, "") or _check(doc, DOCUMENT, "")
    if p:
        return p
    keys = set()
    for i, m in enumerate(doc.get("measurements") or []):
        if m["key"] in keys:
            return f"measurements[{i}].key: {_short(m['key'])} appears twice"
        keys.add(m["key"])
        if m["status"] in ("failed", "skipped"):
            for k in ("tok_s", "aggregate_tok_s", "ttft_s", "tpot_ms"):
                if m.get(k) is not None:
                    return f"measurements[{i}].{k}: set on a {m['status']} measurement (must be null)"
    return None


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


def load(path: str | Path) -> dict[str, Any]:
    """Read, parse and check one result file; ResultError naming the file and field."""
    from gpubox.errors import os_error
    from gpubox.readlimit import NotRegular, read_regular

    p = Path(path)
    try:
        data = read_regular(p, MAX_BYTES, what="result")  # a FIFO or /dev/zero: one line, at once
    except NotRegular as exc:
        raise ResultError(exc.problem, "give one result document (a regular JSON file)") from None
    except IsADirectoryError:
        raise ResultError(f"{p}: is a directory", "name the result JSON file itself") from None
    except FileNotFoundError:
        raise ResultError(f"{p}: no such file", "check the path of the result JSON") from None
    except OSError as exc:
        raise os_error(exc) from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        from gpubox.errors import not_utf8

        raise not_utf8(f"result {p}", data, exc) from None
    return check(parse(text, str(p)), str(p))


def history_line(line: str, where: str) -> dict[str, Any]:
    """The document of one history store line, checked; ResultError naming WHERE (file:line)."""
    rec = parse(line, where)
    if not isinstance(rec, dict) or not isinstance(rec.get("doc"), dict):
        raise ResultError(f"{where}: not a history record", "a line is {history, recorded_at, doc}")
    h = rec.get("history")
    if h is not None and h != HISTORY_SCHEMA:
        raise ResultError(f"{where}: history: {_short(h)}, expected {HISTORY_SCHEMA!r}", "upgrade gpubox")
    return check(rec["doc"], where)
