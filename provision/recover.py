"""The whole box in one command: every area's steps as one pipeline, then the verification
benchmark and its report.

Order (gpubox.areas.PIPELINE): host devices -> container config -> container (re)start -> CUDA probe ->
host tuning -> NCCL env -> staging -> benchmark -> report. Host-side steps run in the "host"
lane and container-side steps in the "container" lane, so staging overlaps with host tuning.
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from gpubox import areas, selection
from gpubox.boxlock import lock_for
from gpubox.errors import GpuboxError, Interrupted
from gpubox.pipeline import Node, run_pipeline
from gpubox.readlimit import NotRegular, read_regular
from gpubox.state import state_dir
from gpubox.steps import RunReport, Step, StepResult, evidence_dict

# --skip/--only accept whole step names or these groups (<area>/area.py, found through gpubox.areas).
GROUPS = areas.step_groups()


class _DoctorBench(Step):
    """The bench step as doctor sees it: a missing or old result is no fault of the box, and no
    health either: it is skipped (not measured), never counted as ok."""

    def __init__(self, inner: Step):
        self.inner = inner
        self.name, self.title, self.where = inner.name, inner.title, inner.where
        self.requires, self.lane, self.measures = inner.requires, inner.lane, inner.measures

    def options(self, ctx):
        return self.inner.options(ctx)

    def gather(self, ctx):
        return self.inner.gather(ctx)

    def decide(self, facts, opts):
        f = self.inner.decide(facts, opts)
        if f.status == "drift" and "verdict" not in evidence_dict(f.evidence):
            f.status = "skipped"
            f.detail += " (run `gpubox bench BOX` or `gpubox recover BOX` to measure)"
        return f


def collect_steps(ctx) -> list[Step]:
    """Every area's steps in pipeline order (gpubox.areas.PIPELINE). A measuring step (the bench)
    is wrapped for doctor: a missing or old result is no fault of the box."""
    out: list[Step] = []
    for mod_name in areas.PIPELINE:
        for st in importlib.import_module(mod_name).steps(ctx):
            out.append(_DoctorBench(st) if st.measures else st)
    return out


def selected(steps: list[Step], skip=(), only=()) -> list[Step]:
    """The steps --skip/--only keep (whole step names or groups; an unknown word is exit 2)."""
    names = [s.name for s in steps]
    first = {
        g: min((names.index(m) for m in ms if m in names), default=len(names)) for g, ms in GROUPS.items()
    }
    groups = {g: GROUPS[g] for g in sorted(GROUPS, key=lambda g: first[g])}  # listed in pipeline order
    keep = set(selection.select(names, groups, skip, only))
    return [s for s in steps if s.name in keep]


def build_nodes(steps: list[Step], skip=(), only=()) -> list[Node]:
    return [Node(s) for s in selected(steps, skip, only)]


@dataclass
class Outcome:
    report: RunReport
    bench: dict[str, Any] | None = None
    bench_path: str | None = None
    report_path: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str | None:
        return (self.bench or {}).get("verdict", {}).get("status")

    @property
    def exit_code(self) -> int:
        if not self.report.ok:
            return 1
        if self.bench is not None and self.verdict != "healthy":
            return 1
        return 0

    def to_dict(self) -> dict[str, Any]:
        d = self.report.to_dict()
        d["benchmark"] = (
            None
            if self.bench is None
            else {"verdict": self.bench.get("verdict"), "result": self.bench_path, "report": self.report_path}
        )
        d["notes"] = self.notes
        d["ok"] = self.exit_code == 0
        return d


def _progress(ctx):
    con = ctx.console
    if con is None:
        return None, None
    sym = {
        "ok": "[green]ok[/]",
        "fixed": "[cyan]fixed[/]",
        "drift": "[yellow]drift[/]",
        "failed": "[bold red]failed[/]",
        "skipped": "[dim]skipped[/]",
    }

    live = con.is_terminal

    def start(node):
        # on a terminal only: in a pipe or a log the two lanes' start lines fell between the other
        # lane's results, and each step showed twice; there a step is its one result line
        if live:
            con.print(f"[dim]…[/] {escape(node.name)} ({escape(node.step.host_name(ctx))})")

    def done(res: StepResult):
        # the whole detail, wrapped by the console: a cut at a fixed length stopped mid-word
        where = "" if live else f" ({escape(res.host)})" if getattr(res, "host", None) else ""
        con.print(
            f"  {sym.get(res.status, res.status)} {res.name}{where}: {escape(res.detail)} "
            f"[dim]({res.seconds:.2f} s)[/]"
        )

    return start, done


def _last_run_path(box: str) -> Path:
    from gpubox.state import safe_name

    return state_dir() / f"recover-{safe_name(box)}.json"


def doctor(ctx, skip=(), only=()) -> RunReport:
    nodes = build_nodes(collect_steps(ctx), skip, only)
    start, done = _progress(ctx)
    return run_pipeline(ctx, nodes, "check", on_result=done)


def doctor_dict(ctx) -> dict[str, Any]:
    """Doctor's read-only checks of every step as a RunReport dict: what a scheduled health
    check exports next to its verdict (bench.runonce finds it through the area registry)."""
    return doctor(ctx, (), ()).to_dict()


def recover(
    ctx,
    *,
    dry_run: bool = False,
    skip=(),
    only=(),
    bench: bool = True,
    profile: str | None = None,
    out_dir: str | None = None,
    report_format: str = "md",
) -> Outcome:
    """check -> plan -> apply -> verify every step, then benchmark and report."""
    last = _last_run_path(ctx.box.name)
    notes = []
    if last.exists() and not dry_run:
        try:
            prev = json.loads(read_regular(last, 16 << 20, what="last-run record"))
            bad = [
                s["name"]
                for s in prev.get("steps", [])
                if s["status"] in ("failed", "drift") or (s.get("evidence") or {}).get("blocked_by")
            ]
            if bad:
                notes.append(f"previous run stopped at {bad[0]}; picking up from a fresh check of every step")
        except (ValueError, KeyError, TypeError, AttributeError, OSError, NotRegular):
            pass  # a damaged or planted record only costs this note
    chosen = selected(collect_steps(ctx), skip, only)
    if bench and any(s.measures for s in chosen):
        from gpubox.bench.runner import resolve_run

        resolve_run(ctx, profile)  # every benchmark option checked before any repair (exit 2)
    # A measuring step is not run as a step: recover benchmarks itself once the repairs are done
    # (a benchmark is a measurement, not a change), when --skip/--only kept it.
    nodes = [Node(s) for s in chosen if not s.measures]
    start, done = _progress(ctx)
    # The plan asked about is the plan applied: one hold of the box lock covers both (reentrant).
    with lock_for(ctx, "plan" if dry_run else "apply"):
        refused = None if dry_run else _consent_first(ctx, nodes)
        if refused is not None:
            return Outcome(refused, notes=notes + ["nothing was changed: the plan above was not accepted"])
        report = run_pipeline(ctx, nodes, "plan" if dry_run else "apply", on_start=start, on_result=done)
    outcome = Outcome(report, notes=notes)
    if bench and not dry_run and any(s.measures for s in chosen):
        problems = remaining_problems(report)
        needed = bench_needs(chosen)
        blocking = [r.name for r in problems if r.name in needed]
        if blocking:
            outcome.notes.append(
                f"benchmark not run: it needs {', '.join(blocking)}; fix that first (or re-run with --no-bench)"
            )
        else:  # what is left cannot stop a measurement: measure, and the verdict names it
            try:
                _bench_and_report(
                    ctx,
                    outcome,
                    profile,
                    out_dir,
                    report_format,
                    unrepaired=[_problem_line(r) for r in problems],
                )
            except KeyboardInterrupt as exc:  # Ctrl-C in the benchmark: say what the repairs changed
                if isinstance(exc, Interrupted):
                    raise
                raise Interrupted(report.steps, ["bench (the verification benchmark)"]) from exc
    if not dry_run:
        from gpubox.safeio import write_text

        write_text(last, json.dumps(outcome.to_dict(), indent=2, default=str))
    return outcome


def _consent_first(ctx, nodes: list[Node]) -> RunReport | None:
    """Consent is decided before anything changes. Without --yes the plan is read first (check and
    plan only); when it restarts the container: at a terminal the whole plan is asked about once
    (a yes covers every step of this run); with no terminal to ask, GpuboxError (exit 2) with
    nothing changed, instead of repairing the host and then stopping at the restart.
    The plan-mode report when the answer was no; None to go on."""
    if ctx.opt("yes") or ctx.opt("restart", "auto") != "auto":
        return None
    preview = run_pipeline(ctx, nodes, "plan")
    ctx.forget()  # apply reads every fact again
    ctx.memo.clear()
    restart = [r for r in preview.steps if r.name == "container" and r.evidence.get("need") == "reboot"]
    if not restart:
        return None
    changes = [r for r in preview.steps if r.status == "drift" and (r.commands or r.diff)]
    confirm = ctx.opt("confirm")
    if not callable(confirm):
        raise GpuboxError(
            f"recover {ctx.box.name} would change {len(changes)} step(s) and restart the container "
            "(a reboot interrupts what runs in it); there is no terminal to ask: nothing was changed",
            f"re-run with --yes, or --restart never to repair the rest, or `recover {ctx.box.name} --dry-run` to see the plan",
        )
    if ctx.console is not None:
        ctx.console.print(f"[bold]gpubox recover {ctx.box.name}[/] will:")
        for r in changes:
            ctx.console.print(f"  {r.name}: {escape(r.detail)}")
    if confirm(f"Apply these {len(changes)} change(s) to {ctx.box.name}, restarting its container?"):
        ctx.options["yes"] = True  # the one answer covers the restart too
        return None
    return preview


# What a measurement needs besides the steps the benchmark step requires (and theirs): the weights it
# serves and the NCCL environment its server starts with. A problem anywhere else -- a PCIe link
# trained low, MaxReadReq refused under kernel lockdown, an ACS finding -- leaves a box that can
# still be measured, and deserves a measured verdict (degraded, naming it) rather than none.
BENCH_NEEDS = ("model-stage", "drafter-stage", "nccl-env")


def bench_needs(chosen: list[Step]) -> set[str]:
    """Names of the chosen steps the benchmark cannot run without: BENCH_NEEDS and every
    measuring step's `requires`, with their own `requires`, transitively."""
    by = {s.name: s for s in chosen}
    todo = [r for s in chosen if s.measures for r in (s.requires or ())] + list(BENCH_NEEDS)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in by:
            continue
        seen.add(name)
        todo += list(by[name].requires or ())
    return seen


def remaining_problems(report: RunReport) -> list[StepResult]:
    """The steps that did not end ok: drift, failed, or blocked by one that did not."""
    return [
        r
        for r in report.steps
        if r.status in ("drift", "failed") or (r.status == "skipped" and r.evidence.get("blocked_by"))
    ]


def _problem_line(r: StepResult) -> str:
    return f"not repaired: {r.name}: {r.detail}" + (f" ({r.cause})" if r.cause else "")


def headline(doc: dict[str, Any]) -> str:
    """Single-stream decode tok/s per method across TP sizes, e.g. 'decode@1024 tok/s TP1/4/8:
    auto 26.6/37.8/37.6, ddtree:15 173.4/281.1/263.9' (the seed's comparison)."""
    ms = [m for m in doc.get("measurements", []) if m.get("workload") == "decode" and m.get("status") == "ok"]
    if not ms:
        return "no decode measurement"
    out_len = (
        1024 if any(m.get("output_len") == 1024 for m in ms) else max(m.get("output_len") or 0 for m in ms)
    )
    ms = [m for m in ms if m.get("output_len") == out_len]
    tps = sorted({m["tp"] for m in ms})
    parts = []
    for label in dict.fromkeys(m["label"] for m in ms):
        by_tp = {m["tp"]: m["tok_s"] for m in ms if m["label"] == label}
        parts.append(f"{label} " + "/".join(f"{by_tp[t]:.1f}" if t in by_tp else "-" for t in tps))
    return f"decode@{out_len} tok/s TP{'/'.join(map(str, tps))}: " + ", ".join(parts)


def repairs(report: RunReport) -> list[dict[str, Any]]:
    """Each change this recover made (steps that ended fixed): what, where, the values set (the
    step's before -> after detail) and the commands it ran."""
    return [
        {"step": s.name, "host": s.host, "detail": s.detail, "commands": s.commands}
        for s in report.steps
        if s.changed
    ]


def _record_repairs(outcome: Outcome) -> None:
    """Put the repairs into the result document (its optional `repairs` key), so the report made
    from it lists them next to the measurement they preceded."""
    doc, path = outcome.bench, outcome.bench_path
    doc["repairs"] = repairs(outcome.report)
    p = Path(path) if path else None
    if p is not None and p.is_file() and p.stem == doc.get("run_id"):
        from gpubox.bench import results

        results.write({k: v for k, v in doc.items() if k != "path"}, p.parent)  # atomic, validated


def _bench_and_report(ctx, outcome: Outcome, profile, out_dir, report_format, unrepaired=()) -> None:
    from gpubox.bench import runner
    from gpubox.state import sub_dir

    out = Path(out_dir or sub_dir("results", ctx.box.id))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    from gpubox.bench.runonce import run_lock

    try:
        with run_lock(ctx):  # never overlap a scheduled health check of the same box
            doc = runner.run_box(ctx, profile=profile, out_dir=str(out), unrepaired=list(unrepaired))
    except GpuboxError as exc:  # the repairs above stand; say why there is no verdict
        outcome.report.steps.append(
            StepResult(
                "bench",
                ctx.box.container.name,
                "failed",
                detail=f"benchmark could not run: {exc}",
                repair="fix that, or re-run with --no-bench and measure with `gpubox bench run --url URL`",
                seconds=time.monotonic() - t0,
                title="verification benchmark",
            )
        )
        return
    outcome.bench = doc
    outcome.bench_path = doc.get("path") or str(out)
    _record_repairs(outcome)
    verdict = doc.get("verdict", {})
    reasons = "; ".join(r.get("message", "") for r in verdict.get("reasons", [])[:3])
    outcome.report.steps.append(
        StepResult(
            "bench",
            ctx.box.container.name,
            {"healthy": "ok", "degraded": "drift"}.get(verdict.get("status"), "failed"),
            detail=f"verdict {verdict.get('status')}: " + (reasons or headline(doc)),
            seconds=time.monotonic() - t0,
            title="verification benchmark",
        )
    )
    from gpubox.bench.report import make_report

    fmt = {"md": "md", "html": "html", "latex": "latex"}[report_format]
    try:
        rep = make_report(
            [outcome.bench_path], fmt=fmt, outdir=out / f"report-{Path(outcome.bench_path).stem}"
        )
        outcome.report_path = str(rep.main)
    except Exception as exc:  # a report problem must not hide the verdict
        outcome.notes.append(f"report not written: {exc}")


def render_outcome(outcome: Outcome, title: str) -> None:
    """What recover did, on the terminal: the report, its notes, the benchmark verdict and where the
    results and report went (`gpubox recover` and `gpubox demo`)."""
    from gpubox.output import console, render_report

    con = console()
    render_report(outcome.report, con, title=title)
    for n in outcome.notes:
        con.print(f"[yellow]note:[/] {escape(n)}")
    if outcome.bench is not None:
        v = outcome.bench.get("verdict", {})
        colour = {"healthy": "green", "degraded": "yellow"}.get(v.get("status"), "red")
        con.print(f"benchmark verdict: [{colour}]{v.get('status')}[/]")
        for r in v.get("reasons", []):
            con.print(f"  - {escape(r.get('message', ''))}")
        con.print(f"results: {outcome.bench_path}")
        if outcome.report_path:
            con.print(f"report:  {outcome.report_path}")
