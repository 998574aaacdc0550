"""Load benchmark result documents (`gpubox.bench/1`, docs/result-schema.md) for reports.

Only what a report needs is checked; unknown keys are ignored as the schema asks. A file that
cannot be used raises a GpuboxError naming the file, the problem and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from gpubox.errors import GpuboxError

SCHEMA = "gpubox.bench/1"
STATUSES = ("ok", "failed", "skipped")
WORKLOADS = ("decode", "concurrency", "long_context", "agentic")

# method -> how people name it (the seed report's words). Unknown methods print as given.
METHOD_NAMES = {
    "auto": "auto",
    "ar": "auto",
    "autoregressive": "auto",
    "dflash": "DFlash",
    "linear": "DFlash",
    "ddtree": "DDTree",
}


def method_name(method: str | None, budget: int | None) -> str:
    """'ddtree', 15 -> 'DDTree b15'; 'auto' -> 'auto'."""
    name = METHOD_NAMES.get(str(method).lower(), str(method))
    return name if budget is None else f"{name} b{budget}"


def method_order(label: str, method: str | None, budget: int | None) -> tuple:
    """Sort auto first, then DFlash, then DDTree, each by budget."""
    rank = {"auto": 0, "DFlash": 1, "DDTree": 2}.get(METHOD_NAMES.get(str(method).lower(), ""), 3)
    return (rank, budget if budget is not None else -1, label)


@dataclass
class Measurement:
    raw: dict

    def __getattr__(self, name: str) -> Any:  # key, tp, label, workload, status, ... (schema fields)
        try:
            return self.__dict__["raw"].get(name)
        except KeyError:  # pragma: no cover - during unpickling
            raise AttributeError(name) from None

    @property
    def ok(self) -> bool:
        return self.raw.get("status") == "ok"

    @property
    def value(self) -> float | None:
        """The headline figure: aggregate tok/s for concurrency, decode tok/s otherwise."""
        if not self.ok:
            return None
        v = self.raw.get("aggregate_tok_s") if self.workload == "concurrency" else self.raw.get("tok_s")
        return float(v) if isinstance(v, (int, float)) else None

    @property
    def accept_len(self) -> float | None:
        acc = self.raw.get("acceptance")
        if self.ok and isinstance(acc, dict) and isinstance(acc.get("mean_length"), (int, float)):
            return float(acc["mean_length"])
        return None

    @property
    def method_name(self) -> str:
        return method_name(self.method, self.budget)


@dataclass
class ResultDoc:
    """One result document plus the short name the report calls it by."""

    doc: dict
    path: str
    name: str
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def box(self) -> str:
        return str(self.doc.get("box", "?"))

    @property
    def facts(self) -> dict:
        return self.doc.get("facts") or {}

    @property
    def verdict(self) -> dict:
        return self.doc.get("verdict") or {}

    @property
    def servers(self) -> list[dict]:
        return [s for s in self.doc.get("servers") or [] if isinstance(s, dict)]

    def select(self, workload: str | None = None, **where: Any) -> list[Measurement]:
        """Measurements of a workload whose fields equal `where` (any status)."""
        out = []
        for m in self.measurements:
            if workload and m.workload != workload:
                continue
            if all(m.raw.get(k) == v for k, v in where.items()):
                out.append(m)
        return out

    def get(self, workload: str, **where: Any) -> Measurement | None:
        found = self.select(workload, **where)
        return found[0] if found else None

    def labels(self, workload: str | None = None) -> list[tuple[str, str | None, int | None]]:
        """Distinct (label, method, budget) in display order."""
        seen = {}
        for m in self.select(workload):
            seen.setdefault(m.label, (m.label, m.method, m.budget))
        return sorted(seen.values(), key=lambda t: method_order(*t))

    def gpu_numa(self) -> dict[int, int | None]:
        """GPU index -> NUMA node from the facts; -1 or missing means unknown (docs/facts.md "A real GPU machine")."""
        out = {}
        for g in self.facts.get("gpus") or []:
            if isinstance(g, dict) and isinstance(g.get("index"), int):
                n = g.get("numa_node")
                out[g["index"]] = n if isinstance(n, int) and n >= 0 else None
        return out

    def server_for(self, tp: int, label: str) -> dict | None:
        for s in self.servers:
            if s.get("tp") == tp and s.get("label") == label:
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
    out = []
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
        out.append(Measurement(m))
    for k in ("facts", "verdict"):
        if doc.get(k) is not None and not isinstance(doc[k], dict):
            raise _fail(path, f"'{k}' is not an object")
    if doc.get("servers") is not None and not isinstance(doc["servers"], list):
        raise _fail(path, "'servers' is not a list")
    return ResultDoc(doc=doc, path=path, name=name or Path(path).stem, measurements=out)


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
