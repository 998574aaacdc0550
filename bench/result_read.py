"""The reading rules of the result document (`gpubox.bench/1`) and its history line: the schema
strings and lists, the size and depth bounds, strict JSON parsing and bounded file reading, and
the one error type (ResultError, exit 2, naming the file or store line and the field). The shape
itself is declared by the models (bench.result_model); bench.schema is the entry point readers use.
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
        return data.decode()
    except UnicodeDecodeError as exc:
        from gpubox.errors import not_utf8

        raise not_utf8(f"result {p}", data, exc) from None
