"""The run history: every benchmark result document of a box, kept in the state directory.

Store: one JSON Lines file per box, `<state dir>/history/<box>.jsonl`, one run a line:

    {"history": "gpubox.history/1", "recorded_at": "2026-11-29T10:19:13Z",
     "doc": { ...the gpubox.bench/1 result document (docs/result-schema.md), without
              measurements[*].samples... }}

JSONL rather than SQLite because the scheduled runs write it on the box (the unit sets
GPUBOX_STATE_DIR=/var/lib/gpubox there) and `gpubox history --on-box` / `schedule status` read it
back over any transport with a plain `cat`; a few runs a day stay small for years. Raw
per-request samples stay in the result file and are dropped here.

Writes take an exclusive flock on `<box>.jsonl.lock`. A new run is appended; recording a run_id
that is already there replaces that line (the benchmark records a run, the scheduler records it
again with the history verdict) through a temporary file and a rename, so readers never see a
half-written store.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

from gpubox.errors import GpuboxError, os_error
from gpubox.identity import encode_name
from gpubox.readlimit import read_fd
from gpubox.safeio import append, makedirs, open_fd, write_atomic
from gpubox.state import state_dir

from .result_model import BOX_ID_RE as _BOX_KEY  # one definition
from .result_read import SCHEMA  # noqa: F401 - history.SCHEMA, for the writers of failed runs

MAX_STORE_BYTES = 1 << 30  # a store of a line per run: years of nightly runs are a few MiB


def history_dir(base: Path | None = None) -> Path:
    return makedirs((base or state_dir()) / "history")  # mkdirat, no link followed (gpubox.safeio)


class BoxKey(str):
    """A box identity passed where a Box would be (hashable, e.g. as a fact's argument)."""

    @property
    def id(self) -> str:
        return str(self)


def store_key(box: Any) -> str:
    """The history key: a Box's identity (Proxmox host + vmid, gpubox.identity.box_id), or for a
    name (a server measured by URL, a document that names no identity) that name encoded.

    Injective across both kinds: a box key always ends in `-ct<digits>` and holds no `~`; a name
    whose encoding would end like that is prefixed `name~`. So `history ct200` never mixes the runs
    of two boxes called ct200 in two inventories, nor of gpu.a and gpu_a."""
    ident = getattr(box, "id", None)
    if isinstance(ident, str):
        return ident
    name = str(box or "")
    if not name:
        raise GpuboxError("a history needs a box name", "name the box")
    enc = encode_name(name)
    return f"name~{enc}" if _BOX_KEY.match(enc) else enc


def doc_key(doc: dict[str, Any]) -> str:
    """Where a result document belongs: its box_id when it carries one, else its box name."""
    bid = doc.get("box_id")
    return bid if isinstance(bid, str) and _BOX_KEY.match(bid) else store_key(doc.get("box"))


def store_path(box: Any, base: Path | None = None) -> Path:
    """The JSONL file holding BOX's runs (BOX: an inventory Box or a name)."""
    return key_path(store_key(box), base)


def key_path(key: str, base: Path | None = None) -> Path:
    return history_dir(base) / f"{key}.jsonl"


@contextmanager
def _locked(path: Path):
    # never through a planted link at any component beneath the state directory (gpubox.safeio)
    fd = open_fd(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _trim(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without raw samples (they stay in the result file)."""
    out = copy.deepcopy(doc)
    for m in out.get("measurements") or []:
        if isinstance(m, dict):
            m.pop("samples", None)
    return out


def validate(doc: Any, where: str = "result document") -> None:
    """Refuse anything that is not a gpubox.bench/1 document naming its box and run
    (bench.result_rules.record_check)."""
    from .result_rules import record_check

    record_check(doc, where)


def parse_lines(text: str, where: str = "history", problems: list[str] | None = None) -> list[dict[str, Any]]:
    """Result documents from the store's text, oldest first. A line that is torn (a crash
    mid-append), or breaks bench.schema (NaN, wrong types, a newer schema version...) is
    skipped, and said in PROBLEMS as `<where>:<line>: <field>: <what>`: it must not hide the rest,
    nor be listed as a run."""
    from .schema import ResultError, history_line

    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            doc = history_line(line, f"{where}:{n}")
        except ResultError as exc:
            if problems is not None:
                problems.append(exc.problem)
            continue
        docs.append(doc)
    docs.sort(key=lambda d: (str(d.get("started_at", "")), str(d.get("run_id"))))
    return docs


def record(doc: dict[str, Any], base: Path | None = None) -> None:
    """Store one run (replacing an earlier record of the same run_id). Idempotent."""
    validate(doc)
    path = key_path(doc_key(doc), base)
    from .result_model import BenchResult, HistoryRecord

    line = HistoryRecord.new(BenchResult.from_dict(_trim(doc)), _utc_now()).to_json()
    with _locked(path):
        raw = _read_store(path)
        existing = raw.splitlines()
        same = [i for i, l in enumerate(existing) if _run_id_of(l) == doc["run_id"]]
        if not same:
            torn = bool(raw) and not raw.endswith("\n")  # a crash mid-append: start a new line
            append(path, (("\n" if torn else "") + line + "\n").encode())
            return
        old = json.loads(existing[same[0]]).get("doc")
        if old == _trim(doc) and len(same) == 1:
            return  # the same run again: nothing changes
        keep = [l for i, l in enumerate(existing) if i not in same[1:]]
        keep[same[0]] = line
        write_atomic(path, ("\n".join(keep) + "\n").encode())


def _read_store(path: Path) -> str:
    """The store's text ('' when absent); never through a symlink; bytes that are not UTF-8 (a
    damaged line) are replaced, so one bad line cannot hide the others."""
    try:
        fd = open_fd(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise os_error(exc) from None
    with os.fdopen(fd, "rb") as f:  # a FIFO or a device there: one line, never a hang
        return read_fd(f.fileno(), MAX_STORE_BYTES, path, what="history store").decode(errors="replace")


def _run_id_of(line: str) -> str | None:
    try:
        return json.loads(line)["doc"]["run_id"]
    except (ValueError, KeyError, TypeError):
        return None


def runs(
    box: Any, last: int | None = None, base: Path | None = None, problems: list[str] | None = None
) -> list[dict[str, Any]]:
    """BOX's recorded runs, oldest first (the newest `last` of them when given); only documents
    that belong to BOX (doc_key), whatever else a copied or edited store holds."""
    key = store_key(box)
    path = key_path(key, base)
    docs = [d for d in parse_lines(_read_store(path), str(path), problems) if doc_key(d) == key]
    return docs[-last:] if last else docs


def boxes(base: Path | None = None) -> list[str]:
    """Keys that have a history (box ids, names)."""
    return sorted(p.stem for p in history_dir(base).glob("*.jsonl"))


# -- measurements --------------------------------------------------------------------------
def headline_field(m: dict[str, Any]) -> str:
    """The figure a measurement is judged by: aggregate tok/s under concurrency, else tok/s."""
    return "aggregate_tok_s" if m.get("workload") == "concurrency" else "tok_s"


def value(doc: dict[str, Any], key: str, field: str | None = None) -> float | None:
    """A measurement's figure in one run, or None when absent / not ok."""
    for m in doc.get("measurements") or []:
        if m.get("key") == key:
            if m.get("status", "ok") != "ok":
                return None
            v = m.get(field or headline_field(m))
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return None


def is_healthy(doc: dict[str, Any]) -> bool:
    return ((doc.get("verdict") or {}).get("status")) == "healthy"


def baseline_of(
    docs: Iterable[dict[str, Any]], key: str, n: int = 5, field: str | None = None
) -> tuple[float | None, list[str]]:
    """(median of KEY over the last n healthy runs among DOCS, the run_ids used)."""
    picked: list[tuple[str, float]] = []
    for d in reversed(list(docs)):
        if not is_healthy(d):
            continue
        v = value(d, key, field)
        if v is None:
            continue
        picked.append((d["run_id"], v))
        if len(picked) >= n:
            break
    if not picked:
        return None, []
    return statistics.median(v for _, v in picked), [r for r, _ in picked]


def baseline(box: str, key: str, n: int = 5, field: str = "tok_s") -> float | None:
    """Median of KEY's FIELD over BOX's last n healthy runs (None without any)."""
    return baseline_of(runs(box), key, n, field)[0]
