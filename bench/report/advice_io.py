"""What advice needs besides the result files, read from disk: a probe document, the servers' own
logs, the box's history. Kept out of advice.py so the decision logic stays pure (results in,
advice out) and the same reading serves `gpubox advise` and `gpubox report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.readlimit import read_regular

from .data import ResultDoc

PROBE_SCHEMA = "gpubox.probe/1"
MAX_PROBE_BYTES = 16 << 20  # a probe document is a few KiB; a FIFO or /dev/zero is refused at once
LOG_TAIL_BYTES = 256 * 1024  # vLLM logs its KV cache size at start; the tail of a long log may miss it


def load_probe(path: str | Path) -> dict[str, Any]:
    """A gpubox.probe/1 document, as `python3 hwtune/probe.py` prints it or inside `gpubox probe
    --json` (its "probe" key). Anything else is bad input (GpuboxError, exit 2)."""
    p = Path(path)
    try:
        doc = json.loads(read_regular(p, MAX_PROBE_BYTES, what="probe document").decode("utf-8"))
    except FileNotFoundError:
        raise GpuboxError(f"{p}: no such file", "check the path of the probe JSON") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuboxError(
            f"{p}: cannot read: {exc}", "give a file written by `gpubox probe --json`"
        ) from None
    except json.JSONDecodeError as exc:
        raise GpuboxError(
            f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            "give a file written by `gpubox probe --json`",
        ) from None
    if isinstance(doc, dict) and isinstance(doc.get("probe"), dict):
        doc = doc["probe"]
    if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise GpuboxError(
            f"{p}: not a probe document (schema {got!r}, expected {PROBE_SCHEMA!r})",
            "give the output of `gpubox probe --json` or `python3 hwtune/probe.py`",
        )
    return doc


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - LOG_TAIL_BYTES))
        return f.read().decode("utf-8", "replace")


def server_logs(run: ResultDoc) -> dict[tuple[int, str], str]:
    """(tp, label) -> what the run kept of each server's log: its log_tail, and the log file it
    names when that is a readable regular file on this machine (results fetched from a box carry
    the path of the local copy). A missing or unreadable log only means less evidence."""
    out: dict[tuple[int, str], str] = {}
    for s in run.servers:
        parts = []
        tail = s.log_tail
        if isinstance(tail, list):
            parts.append("\n".join(map(str, tail)))
        elif isinstance(tail, str):
            parts.append(tail)
        log = s.log
        if isinstance(log, str) and log:
            p = Path(log)
            try:
                if p.is_file():
                    parts.append(_tail(p))
            except OSError:
                pass
        if parts and isinstance(s.tp, int):
            out[(s.tp, str(s.label))] = "\n".join(parts)
    return out


def history_docs(box: str) -> list[dict[str, Any]]:
    """The box's recorded runs, oldest first; [] when it has none or its name cannot name a store."""
    from gpubox.bench import history

    try:
        return history.runs(box)
    except GpuboxError:
        return []
