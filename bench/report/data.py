"""Load benchmark result documents (`gpubox.bench/1`, docs/result-schema.md) for reports.

A report reads the typed model (bench.result_model.BenchResult: its measurements, servers, facts
and verdict) that every reader loads through; unknown keys are kept, not used. A file that cannot
be used raises a GpuboxError naming the file, the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from gpubox.docmodel import Problem
from gpubox.errors import GpuboxError

from ..result_model import METHOD_NAMES as METHOD_NAMES  # the report's names for them
from ..result_model import (
    BenchResult,
    Facts,
    Measurement,
    Server,
    Verdict,
)  # noqa: F401
from ..result_model import method_name as method_name
from ..result_model import method_order as method_order
from ..result_read import SCHEMA, STATUSES, WORKLOADS  # noqa: F401 - one definition

_ANY = object()


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


@dataclass
class ResultDoc:
    """One result document (typed: `result`; as read: `doc`) plus the short name the report
    calls it by."""

    doc: dict
    path: str
    name: str
    result: BenchResult = field(default_factory=BenchResult)

    @property
    def measurements(self) -> list[Measurement]:
        return self.result.measurements

    @property
    def box(self) -> str:
        return str(self.doc.get("box", "?"))

    @property
    def facts(self) -> Facts:
        return self.result.facts or Facts()

    @property
    def verdict(self) -> Verdict:
        return self.result.verdict or Verdict(status=None, reasons=[])

    @property
    def servers(self) -> list[Server]:
        return self.result.servers

    def select(self, workload: str | None = None, **where: Any) -> list[Measurement]:
        """Measurements of a workload whose fields equal `where` (any status), in document order.

        Served from an index by (workload, tp, label), built once per run: the findings ask once
        per configuration, and a scan of every measurement per question was quadratic in a run
        with many configurations."""
        tp, label = where.get("tp", _ANY), where.get("label", _ANY)
        if workload and tp is not _ANY and label is not _ANY and _hashable(tp) and _hashable(label):
            pool = self._index().get((workload, tp, label), [])
            rest = {k: v for k, v in where.items() if k not in ("tp", "label")}
        else:
            pool, rest = self.measurements, where
            if workload:
                pool = self._index().get(workload, [])
        out = []
        for m in pool:
            if all(getattr(m, k) == v for k, v in rest.items()):
                out.append(m)
        return out

    def _index(self) -> dict:
        cached = self.__dict__.get("_select_index")
        if cached is not None and cached[0] is self.measurements and cached[1] == len(self.measurements):
            return cached[2]
        index: dict = {}
        for m in self.measurements:
            index.setdefault(m.workload, []).append(m)
            tp, label = m.tp, m.label
            if _hashable(tp) and _hashable(label):
                index.setdefault((m.workload, tp, label), []).append(m)
        self.__dict__["_select_index"] = (self.measurements, len(self.measurements), index)
        return index

    def get(self, workload: str, **where: Any) -> Measurement | None:
        found = self.select(workload, **where)
        return found[0] if found else None

    def labels(self, workload: str | None = None) -> list[tuple[str, str | None, int | None]]:
        """Distinct (label, method, budget) in display order."""
        cache = self.__dict__.setdefault("_labels_cache", {})
        key = (workload, len(self.measurements))
        if key not in cache:  # once per run and workload: findings ask per configuration
            seen = {}
            for m in self.select(workload):
                seen.setdefault(m.label, (m.label, m.method, m.budget))
            cache[key] = sorted(seen.values(), key=lambda t: method_order(*t))
        return list(cache[key])

    def gpu_numa(self) -> dict[int, int | None]:
        """GPU index -> NUMA node from the facts; -1 or missing means unknown (docs/facts.md "A real GPU machine")."""
        out = {}
        for g in self.facts.gpu_list():
            if isinstance(g.index, int):
                n = g.numa_node
                out[g.index] = n if isinstance(n, int) and n >= 0 else None
        return out

    def server_for(self, tp: int, label: str) -> Server | None:
        for s in self.servers:
            if s.tp == tp and s.label == label:
                return s
        return None


def _fail(
    path: str,
    problem: str,
    fix: str = "give a result JSON written by `gpubox bench` (format: docs/result-schema.md)",
) -> GpuboxError:
    return GpuboxError(f"{path}: {problem}", fix)


def load_run(path: str | Path, name: str | None = None) -> ResultDoc:
    """Read and check one result file."""
    from ..schema import load

    p = Path(path)
    return from_doc(load(p), str(p), name)  # strict JSON + bench.schema: one error naming file and field


def from_doc(doc: Any, path: str = "<result>", name: str | None = None) -> ResultDoc:
    if not isinstance(doc, dict):
        raise _fail(path, "top level is not a JSON object")
    schema = doc.get("schema")
    if schema != SCHEMA:
        raise _fail(path, f"schema is {schema!r}, expected {SCHEMA!r}")
    meas = doc.get("measurements")
    if not isinstance(meas, list):
        raise _fail(path, "'measurements' is missing or not a list")
    for i, m in enumerate(meas):
        if not isinstance(m, dict):
            raise _fail(path, f"measurements[{i}] is not an object")
        for k in ("key", "tp", "label", "workload", "status"):
            if m.get(k) is None:
                raise _fail(path, f"measurements[{i}] has no '{k}'")
        if not isinstance(m["tp"], int) or m["tp"] < 1:
            raise _fail(path, f"measurements[{i}] ({m['key']}): tp {m['tp']!r} is not a positive integer")
        if m["status"] not in STATUSES:
            raise _fail(
                path,
                f"measurements[{i}] ({m['key']}): status {m['status']!r} is not one of {', '.join(STATUSES)}",
            )
    for k in ("facts", "verdict"):
        if doc.get(k) is not None and not isinstance(doc[k], dict):
            raise _fail(path, f"'{k}' is not an object")
    if doc.get("servers") is not None and not isinstance(doc["servers"], list):
        raise _fail(path, "'servers' is not a list")
    try:
        result = BenchResult.view(doc)  # the typed fields (load_run has checked the whole document)
    except Problem as exc:
        raise _fail(path, str(exc)) from None
    return ResultDoc(doc=doc, path=path, name=name or Path(path).stem, result=result)


def load_runs(paths: Iterable[str | Path], names: Iterable[str] = ()) -> list[ResultDoc]:
    paths, names = list(paths), list(names)
    if not paths:
        raise GpuboxError("no result file given", "name one or more result JSON files")
    if names and len(names) != len(paths):
        raise GpuboxError(
            f"{len(names)} --name for {len(paths)} result files",
            "give one --name per result file, in the same order",
        )
    runs = [load_run(p, names[i] if names else None) for i, p in enumerate(paths)]
    seen: dict[str, int] = {}
    for r in runs:  # two files with the same stem in different folders still need distinct names
        if r.name in seen:
            seen[r.name] += 1
            r.name = f"{r.name}#{seen[r.name]}"
        else:
            seen[r.name] = 1
    return runs
