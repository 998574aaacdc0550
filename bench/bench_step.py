"""The benchmark as a step of the recover/doctor pipeline.

check:  is the server answering (if one is running on gpubox_bench.port), and what did the box's
        latest benchmark say? A fresh healthy result is ok; none, an old one, or a degraded/failed
        one is drift (the benchmark should run). Facts: the health answer, the latest result and
        its age; the decision over them is pure (`BenchStep.decide`, data cases in tests/steps/bench).
plan:   a `BenchRun` action: the exact server command lines the benchmark would start.
apply:  the action runs the benchmark (bench.runner.run_box).
verify: the verdict of that run: healthy -> ok, degraded -> drift, failed -> failed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.facts import Fact
from gpubox.readlimit import read_regular
from gpubox.steps import OMIT, Action, Execution, Finding, Omit, Plan, Step

from . import history, results, schema
from .launcher import build_command, spec_from_box
from .profiles import resolve_profile

MAX_AGE_S = 24 * 3600


def latest_result(box, out_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The box's newest result: bench.history when present, else the newest JSON in the result dir.

    BOX is the inventory Box (or a name): only documents of that identity count, so doctor on a
    box that was never benchmarked reports no result, not another box's (a glob on `ct2-*` also
    matched ct2-lab's files)."""
    runs = history.runs(box, last=1)
    if runs:
        return runs[-1]
    key = history.store_key(box)
    d = Path(out_dir) if out_dir else results.default_out_dir()
    docs = []
    for p in d.glob("*.json"):
        try:
            doc = json.loads(read_regular(p, schema.MAX_BYTES, what="result"))
        except (OSError, ValueError, GpuboxError):  # a FIFO or device among the results: skipped
            continue
        if schema.problem(doc) is None and history.doc_key(doc) == key:  # damaged files never count
            docs.append(doc)
    return max(docs, key=lambda x: x.get("started_at", "")) if docs else None


def _age_s(doc: dict[str, Any], now: float) -> float:
    try:
        t = datetime.strptime(doc["finished_at"] or doc["started_at"], "%Y-%m-%dT%H:%M:%SZ")
        return now - (t - datetime(1970, 1, 1)).total_seconds()
    except (KeyError, TypeError, ValueError):
        return float("inf")


# --- facts ------------------------------------------------------------------------------------


@dataclass
class Latest:
    """What the decision needs of a result document (gpubox.bench/1)."""

    run_id: str
    status: str  # the verdict: healthy | degraded | failed
    reasons: list[str]  # the verdict's reason messages, in order
    measurements: int
    path: str | None = None  # the result file, when the document says

    @classmethod
    def of(cls, doc: dict[str, Any]) -> "Latest":
        v = doc["verdict"]
        return cls(
            doc["run_id"],
            v["status"],
            [r["message"] for r in v["reasons"]],
            len(doc["measurements"]),
            doc.get("path"),
        )


class ServerHealth(Fact):
    """Does a server answer GET /health with 200 at this URL? (From the control node, like the
    benchmark client; read with the context, no host transport involved.)"""

    where = "box"

    @staticmethod
    def read(ctx, url: str) -> bool:
        import httpx  # here, not at the top: deciding a plan (doctor, a dry run) needs no HTTP client

        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


class LatestResult(Fact):
    """The box's newest result document on the control node (history, else the result dir)."""

    where = "box"

    @staticmethod
    def read(ctx, box: str, out_dir: str | None) -> dict[str, Any] | None:
        return latest_result(box, out_dir)


@dataclass
class Facts:
    server_running: bool
    latest: Latest | None = None
    age_s: float | None = None  # seconds since the latest result finished; None: no readable time


@dataclass
class Options:
    max_age_s: float = MAX_AGE_S  # gpubox_bench.max_age_s: an older result is re-measured


@dataclass
class Evidence:
    run_id: str | Omit = OMIT
    verdict: str | Omit = OMIT  # healthy | degraded | failed
    result: str | None | Omit = OMIT  # the result file
    server_running: bool | Omit = OMIT


def ago(age_s: float | None) -> str:
    """A result's age for people: '40 s', '12 min', '2.3 h', '3.0 d' ('age unknown' without a time)."""
    if age_s is None or age_s != age_s or age_s == float("inf"):
        return "age unknown"
    a = max(0.0, age_s)
    if a < 60:
        return f"{a:.0f} s old"
    if a < 3600:
        return f"{a / 60:.0f} min old"
    if a < 86400:
        return f"{a / 3600:.1f} h old"
    return f"{a / 86400:.1f} d old"


def _finding_from(
    latest: Latest, prefix: str = "", running: bool | Omit = OMIT, age: str | None = None
) -> Finding:
    """The finding a result's verdict stands for: healthy ok, degraded drift, failed failed."""
    top = "; ".join(latest.reasons[:3])
    ev = Evidence(run_id=latest.run_id, verdict=latest.status, result=latest.path, server_running=running)
    when = f", {age}" if age else ""
    if latest.status == "healthy":
        return Finding.ok(
            f"{prefix}benchmark healthy ({latest.measurements} measurements{when})", evidence=ev
        )
    if latest.status == "degraded":
        return Finding.drift(
            f"{prefix}benchmark{f' ({age})' if age else ''} degraded: {top}",
            cause="throughput below expectation/history",
            repair="check the tuning steps (NCCL, MaxReadReq, NUMA balancing), then re-run",
            evidence=ev,
        )
    return Finding.failed(
        f"{prefix}benchmark{f' ({age})' if age else ''} failed: {top}",
        cause="the server failed or requests errored",
        repair="see the server log tail in the result; fix, then `gpubox bench BOX`",
        evidence=ev,
    )


@dataclass
class BenchRun(Action):
    """Run the benchmark of a profile on the box (bench.runner.run_box).

    prepare resolves the profile and the server command lines it starts, one per TP size and
    method (resolving them reads the GPU topology, so only when a plan is asked for); a dry run
    shows those lines (environment first). The benchmark is a measurement, not a repair: its
    verification is the verdict of its own result document, not a re-check of the latest one."""

    profile: str | None = None  # the step's profile; else --bench-profile, gpubox_bench.profile, health
    out_dir: str | None = None  # the step's result directory; else --bench-out
    where: str | None = "container"
    name: str = ""  # the resolved profile's name, by prepare
    commands: list[list[str]] = field(default_factory=list)
    doc: dict[str, Any] | None = None  # the run's result document, after execute

    def prepare(self, run: Execution) -> None:
        ctx = run.ctx
        s = dict(ctx.box.var("gpubox_bench", {}) or {})
        prof = resolve_profile(self.profile or ctx.opt("bench_profile") or s.get("profile", "health"), s)
        from .runner import bounded_tps

        cmds = []
        for tp in bounded_tps(prof["tp"], s.get("tp")):  # the TP sizes run_box runs, no others
            for m in prof["methods"]:
                argv, env = build_command(spec_from_box(ctx, m, int(tp), s))
                cmds.append([f"{k}={v}" for k, v in sorted(env.items())] + argv)
        self.name, self.commands = prof["name"], cmds

    def summary(self) -> str:
        return f"run the {self.name} benchmark ({len(self.commands)} server launches)"

    def describe(self, host) -> list[list[str]]:
        return [list(c) for c in self.commands]

    def execute(self, run: Execution) -> None:
        from .runner import run_box

        ctx = run.ctx
        self.doc = run_box(ctx, profile=self.name, out_dir=self.out_dir or ctx.opt("bench_out"))

    def verified(self, recheck) -> Finding:
        if self.doc is None:
            return recheck()
        return _finding_from(Latest.of(self.doc))


class BenchStep(Step):
    """The benchmark: check/decide is facts + a pure decision like every step; the drift's plan is
    one `BenchRun` action (the measurement, judged by its own document)."""

    name = "bench"
    title = "server benchmark (TP1/4/8) with health verdict"
    where = "container"
    requires = ("cuda",)
    measures = True

    def __init__(self, profile: str | None = None, out_dir: str | None = None):
        self.profile, self.out_dir = profile, out_dir

    def _settings(self, ctx) -> dict[str, Any]:
        return dict(ctx.box.var("gpubox_bench", {}) or {})

    def options(self, ctx) -> Options:
        v = self._settings(ctx).get("max_age_s", MAX_AGE_S)
        try:
            age = float(v)
        except (TypeError, ValueError):
            age = float("nan")
        if isinstance(v, bool) or not age > 0:  # NaN too: an age is never compared with it
            raise GpuboxError(
                f"{ctx.box.name}: gpubox_bench.max_age_s = {v!r} is not a positive number of seconds",
                "fix gpubox_bench.max_age_s in the inventory (default 86400: one day)",
            )
        return Options(max_age_s=age)

    def gather(self, ctx) -> Facts:
        s = self._settings(ctx)
        url = f"http://{s.get('host', '127.0.0.1')}:{int(s.get('port', 8000))}"
        running = ctx.fact(ServerHealth, url)
        doc = ctx.fact(LatestResult, history.BoxKey(ctx.box.id), self.out_dir or ctx.opt("bench_out"))
        if doc is None:
            return Facts(running)
        age = _age_s(doc, time.time())
        return Facts(running, Latest.of(doc), None if age == float("inf") else age)

    def decide(self, facts: Facts, opts: Options) -> Finding:
        f = self._decide(facts, opts)
        if f.status == "drift":
            f.plan = Plan(actions=[BenchRun(self.profile, self.out_dir)])
        return f

    def _decide(self, facts: Facts, opts: Options) -> Finding:
        running = facts.server_running
        if facts.latest is None:
            return Finding.drift(
                "no benchmark result for this box yet",
                repair="run the benchmark",
                evidence=Evidence(server_running=running),
            )
        age = float("inf") if facts.age_s is None else facts.age_s
        if age > opts.max_age_s:
            return Finding.drift(
                f"latest benchmark is {age / 3600:.1f} h old",
                repair="run the benchmark",
                evidence=Evidence(run_id=facts.latest.run_id, server_running=running),
            )
        f = _finding_from(facts.latest, "latest ", running, ago(facts.age_s))
        if f.status == "failed":  # a failed benchmark is re-run by apply, like a degraded one
            f.status = "drift"
        return f


def steps(ctx) -> list[Step]:
    return [BenchStep()]
