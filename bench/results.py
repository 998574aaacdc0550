"""The result document (`gpubox.bench/1`, docs/result-schema.md): build, validate, write."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpubox import __version__
from gpubox.errors import GpuboxError
from gpubox.state import state_dir

from .schema import SCHEMA, STATUSES, VERDICTS, WORKLOADS  # noqa: F401 - one definition (bench.schema)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def tool_info() -> dict[str, Any]:
    """gpubox version and the git commit of the checkout it runs from (None outside git)."""
    here = Path(__file__).resolve().parent.parent
    commit = None
    try:
        r = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if r.returncode == 0:
            commit = r.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"version": __version__, "git": commit}


def new_document(
    box: str,
    profile: str,
    *,
    simulated: bool = False,
    sim_speed: float | None = None,
    facts: dict[str, Any] | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    from .result_model import BenchResult, Facts, Tool, Verdict

    started = utc_now()
    return BenchResult.build(
        schema=SCHEMA,
        box=box,
        run_id=f"{box}-{started.replace('-', '').replace(':', '')}",
        started_at=started,
        finished_at=None,
        profile=profile,
        tool=Tool.build(**tool_info()),
        simulated=bool(simulated),
        sim_speed=sim_speed,
        url=url,
        facts=Facts.from_dict(facts or {}),
        servers=[],
        measurements=[],
        verdict=Verdict.build(status="failed", reasons=[]),
    ).to_dict()  # a dict the runner fills in; results.write checks and writes it through the model


def finish(doc: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    doc["finished_at"] = utc_now()
    doc["verdict"] = verdict
    return doc


def validate(doc: dict[str, Any]) -> list[str]:
    """Problems with a document, [] when it follows the schema (what consumers rely on): the
    model's read rules and its stricter rules for a document gpubox writes
    (bench.result_rules.write_problems)."""
    from .result_rules import write_problems

    return write_problems(doc)


def default_out_dir() -> Path:
    return state_dir() / "bench"


def write(doc: dict[str, Any], out_dir: str | os.PathLike | None = None) -> Path:
    """Write `<out>/<run_id>.json` atomically; refuses an invalid document (a bug, not user input)."""
    errs = validate(doc)
    if errs:
        raise GpuboxError(f"result document is invalid: {errs[0]}", "this is a gpubox bug; re-run with -v")
    d = Path(out_dir) if out_dir else default_out_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuboxError(
            f"cannot create output directory {d}: {exc.strerror}", "pick a writable --out"
        ) from None
    path = d / result_file_name(doc, d)
    from gpubox.safeio import write_atomic

    from .result_model import BenchResult

    write_atomic(path, BenchResult.from_dict(doc).to_json().encode())  # the model writes what it reads
    return path


def result_file_name(doc: dict[str, Any], d: Path) -> str:
    """`<run_id>.json` (docs/result-schema.md), unless that file holds another box's run (two boxes
    called ct200 in two inventories, the same second): then `<box identity>-<stamp>.json`, so one
    box's result never replaces another's."""
    from . import schema
    from .history import doc_key

    name = f"{doc['run_id']}.json"
    try:
        other = schema.load(d / name)
    except GpuboxError:
        return name  # absent (or not a result at all: replaced by rename, never written through)
    if doc_key(other) == doc_key(doc):
        return name
    stamp = str(doc["run_id"]).rsplit("-", 1)[-1]
    return f"{doc_key(doc)}-{stamp}.json"


def record_history(doc: dict[str, Any]) -> bool:
    """Append to the history store (bench.history); True once recorded."""
    from . import history

    history.record(doc)
    return True


def history_baseline(box):
    """`baseline(key)` over the box's history."""
    from . import history

    docs = history.runs(box)  # read once; the headline figure: aggregate tok/s under concurrency
    return lambda key: history.baseline_of(docs, key, 5, None)[0]


def load(path: str | os.PathLike) -> dict[str, Any]:
    """One result file, parsed strictly and checked against bench.schema (error names file and field)."""
    from . import schema

    return schema.load(path)


del time
