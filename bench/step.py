"""The benchmark as a step of the recover/doctor pipeline.

check:  is the server answering (if one is running on gpubox_bench.port), and what did the box's
        latest benchmark say? A fresh healthy result is ok; none, an old one, or a degraded/failed
        one is drift (the benchmark should run).
plan:   the exact server command lines the benchmark would start.
apply:  run the benchmark (bench.runner.run_box).
verify: the verdict of that run: healthy -> ok, degraded -> drift, failed -> failed.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from gpubox.steps import Finding, Plan, Step

from . import results
from .launcher import build_command, spec_from_box
from .workloads import resolve_profile

MAX_AGE_S = 24 * 3600


def latest_result(box: str, out_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The box's newest result: bench.history when present, else the newest JSON in the result dir."""
    try:
        from . import history
        runs = history.runs(box, last=1)
        if runs:
            return runs[-1]
    except (ImportError, AttributeError):
        pass
    d = Path(out_dir) if out_dir else results.default_out_dir()
    docs = []
    for p in d.glob(f"{box}-*.json"):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("schema") == results.SCHEMA and doc.get("box") == box:
            docs.append(doc)
    return max(docs, key=lambda x: x.get("started_at", "")) if docs else None


def _age_s(doc: dict[str, Any]) -> float:
    try:
        t = datetime.strptime(doc["finished_at"] or doc["started_at"], "%Y-%m-%dT%H:%M:%SZ")
        return time.time() - (t - datetime(1970, 1, 1)).total_seconds()
    except (KeyError, TypeError, ValueError):
        return float("inf")


def _finding_from(doc: dict[str, Any], prefix: str = "") -> Finding:
    v = doc["verdict"]
    top = "; ".join(r["message"] for r in v["reasons"][:3])
    ev = {"run_id": doc["run_id"], "verdict": v["status"], "result": doc.get("path")}
    if v["status"] == "healthy":
        return Finding.ok(f"{prefix}benchmark healthy ({len(doc['measurements'])} measurements)", **ev)
    if v["status"] == "degraded":
        return Finding.drift(f"{prefix}benchmark degraded: {top}", cause="throughput below expectation/history",
                             repair="check the tuning steps (NCCL, MaxReadReq, NUMA balancing), then re-run", **ev)
    return Finding.failed(f"{prefix}benchmark failed: {top}", cause="the server failed or requests errored",
                          repair="see the server log tail in the result; fix, then `gpubox bench BOX`", **ev)


class BenchStep(Step):
    name = "bench"
    title = "server benchmark (TP1/4/8) with health verdict"
    where = "container"
    requires = ("cuda",)

    def __init__(self, profile: str | None = None, out_dir: str | None = None):
        self.profile, self.out_dir = profile, out_dir
        self.doc: dict[str, Any] | None = None

    def _settings(self, ctx) -> dict[str, Any]:
        return dict(ctx.box.var("gpubox_bench", {}) or {})

    def check(self, ctx) -> Finding:
        s = self._settings(ctx)
        url = f"http://{s.get('host', '127.0.0.1')}:{int(s.get('port', 8000))}"
        running = None
        try:
            running = httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            running = False
        doc = latest_result(ctx.box.name, self.out_dir or ctx.opt("bench_out"))
        if doc is None:
            return Finding.drift("no benchmark result for this box yet", repair="run the benchmark",
                                 server_running=running)
        age = _age_s(doc)
        if age > float(s.get("max_age_s", MAX_AGE_S)):
            return Finding.drift(f"latest benchmark is {age / 3600:.1f} h old", repair="run the benchmark",
                                 run_id=doc["run_id"], server_running=running)
        f = _finding_from(doc, "latest ")
        if f.status == "failed":  # a failed benchmark is re-run by apply, like a degraded one
            f.status = "drift"
        f.evidence["server_running"] = running
        return f

    def plan(self, ctx, finding: Finding) -> Plan:
        s = self._settings(ctx)
        prof = resolve_profile(self.profile or ctx.opt("bench_profile") or s.get("profile", "health"), s)
        cmds = []
        for tp in prof["tp"]:
            for m in prof["methods"]:
                argv, env = build_command(spec_from_box(ctx, m, int(tp), s))
                cmds.append([f"{k}={v}" for k, v in sorted(env.items())] + argv)
        return Plan(description=f"run the {prof['name']} benchmark ({len(cmds)} server launches)",
                    commands=cmds, data=prof["name"])

    def apply(self, ctx, plan: Plan) -> None:
        from .runner import run_box
        self.doc = run_box(ctx, profile=plan.data, out_dir=self.out_dir or ctx.opt("bench_out"))

    def verify(self, ctx) -> Finding:
        if self.doc is None:
            return self.check(ctx)
        return _finding_from(self.doc)


def steps(ctx) -> list[Step]:
    return [BenchStep()]
