"""The one step engine: run steps as a small DAG in lanes, in one of three modes.

- "check": doctor; facts and decisions only.
- "plan":  --dry-run; check + the exact plan (diff, argv lists), nothing is changed.
- "apply": check, plan, apply, verify; a step whose `requires` did not end ok/fixed is skipped.

One lane per place a step acts on (the Proxmox host, the container): steps of a lane run in
order, lanes in parallel, so staging inside the container overlaps with tuning on the host while
a step never starts before the steps it requires. `requires` and the lane live on the step class;
`run_steps` is the same engine over a plain list, one lane at a time.
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .errors import BadInput, GpuboxError, Interrupted, TransportError, os_error
from .steps import DRIFT, FAILED, FIXED, MODES, OK, SKIPPED, RunReport, Step, StepResult, evidence_dict


@dataclass
class Node:
    """A step in the graph; `requires` and `lane` default to the step's own."""

    step: Step
    requires: tuple[str, ...] | None = None
    lane: str | None = None

    def __post_init__(self) -> None:
        if self.requires is None:
            self.requires = tuple(getattr(self.step, "requires", ()) or ())
        if self.lane is None:
            self.lane = getattr(self.step, "lane", None) or self.step.where

    @property
    def name(self) -> str:
        return self.step.name


@dataclass
class _Shared:
    results: dict[str, StepResult] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    error: BaseException | None = None


def _title(step: Step) -> str:
    return step.title or step.name


def _result_from(step: Step, ctx, f, status: str | None = None, **kw) -> StepResult:
    return StepResult(
        name=step.name,
        title=_title(step),
        host=step.host_name(ctx),
        status=status or f.status,
        detail=f.detail,
        evidence=evidence_dict(f.evidence),
        cause=f.cause,
        repair=f.repair,
        **kw,
    )


def _commands(step: Step, ctx, plan) -> list[list[str]]:
    """What a dry run shows and apply records: each action's describe(), on the host it acts on."""
    return plan.shown_commands(lambda where: step.host_for(ctx, where))


def _failure(step: Step, ctx, detail: str, repair: str | None = None) -> StepResult:
    return StepResult(
        step.name, step.host_name(ctx), FAILED, detail=detail, title=_title(step), repair=repair
    )


def run_step(step: Step, ctx, mode: str) -> StepResult:
    """One step through the verbs the mode allows. Transport errors and BadInput propagate (exit 2)."""
    t0 = time.monotonic()
    try:
        f = step.check(ctx)
        if f.status != DRIFT or mode == "check":
            res = _result_from(step, ctx, f)
        else:
            plan = step.plan(ctx, f)
            commands = _commands(step, ctx, plan)
            if mode == "plan":
                res = _result_from(step, ctx, f, diff=plan.diff, commands=commands)
                if plan.description:
                    res.detail = f"{f.detail}; would {plan.description}"
            else:
                step.apply(ctx, plan)
                v = step.verify(ctx, plan)
                status = FIXED if v.status == OK else FAILED
                res = _result_from(
                    step, ctx, v, status=status, changed=True, diff=plan.diff, commands=commands
                )
                if status == FIXED:
                    res.detail = f"{f.detail} -> {plan.description or 'repaired'}; verified: {v.detail}"
                    res.cause = f.cause
                else:
                    res.detail = f"applied but verify says: {v.detail}"
                    res.cause = v.cause or f.cause
                    res.repair = v.repair or f.repair
    except (TransportError, BadInput):  # cannot run / bad input only the box shows: exit 2
        raise
    except GpuboxError as exc:
        res = _failure(step, ctx, str(exc))
    except OSError as exc:  # EROFS, EPERM (immutable), ENOSPC, ENOTDIR...: the cause, not "internal error"
        err = os_error(exc)
        res = _failure(step, ctx, err.problem, err.fix)
    except UnicodeDecodeError as exc:
        res = _failure(
            step,
            ctx,
            f"input is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}",
            "fix or re-save the file as UTF-8",
        )
    except Exception as exc:  # a bug or an unexpected state: report it on the step, keep going
        if getattr(ctx, "verbose", False):
            traceback.print_exc()
        res = _failure(
            step,
            ctx,
            f"internal error: {type(exc).__name__}: {exc}",
            "re-run with -v for the traceback and report it",
        )
    res.seconds = time.monotonic() - t0
    return res


def blocked(step: Step, ctx, bad: list[str]) -> StepResult:
    """The record of a step skipped because steps it requires did not end ok or fixed."""
    return StepResult(
        step.name,
        step.host_name(ctx),
        SKIPPED,
        title=_title(step),
        detail=f"blocked: {', '.join(bad)} did not end ok",
        evidence={"blocked_by": bad},
        repair=f"fix {', '.join(bad)} first, then re-run",
    )


def run_steps(
    ctx, steps: Iterable[Step], mode: str = "check", on_result: Callable[[StepResult], None] | None = None
) -> RunReport:
    """A plain list of steps through the engine, in the order given (one step at a time)."""
    return run_pipeline(ctx, [Node(s) for s in steps], mode, on_result=on_result, parallel=False)


def _check_order(nodes: list[Node]) -> None:
    """Refuse a graph whose lane order contradicts its requirements (it would deadlock)."""
    names = {n.name for n in nodes}
    done: set[str] = set()
    lanes: dict[str, list[Node]] = {}
    for n in nodes:
        lanes.setdefault(n.lane, []).append(n)
    heads = {lane: 0 for lane in lanes}
    while len(done) < len(nodes):
        progressed = False
        for lane, seq in lanes.items():
            i = heads[lane]
            if i < len(seq) and all(r in done or r not in names for r in seq[i].requires):
                done.add(seq[i].name)
                heads[lane] += 1
                progressed = True
        if not progressed:
            stuck = [seq[heads[l]].name for l, seq in lanes.items() if heads[l] < len(seq)]
            raise ValueError(f"pipeline order deadlocks at {stuck}")


def run_pipeline(
    ctx,
    nodes: Iterable[Node],
    mode: str = "check",
    *,
    on_start: Callable[[Node], None] | None = None,
    on_result: Callable[[StepResult], None] | None = None,
    parallel: bool = True,
) -> RunReport:
    """Run nodes lane by lane; in apply mode a node whose requirement did not end ok/fixed is skipped."""
    if mode not in MODES:
        raise ValueError(mode)
    nodes = list(nodes)
    check_options(ctx, [n.step for n in nodes])
    from .boxlock import lock_for

    with lock_for(ctx, mode) as info:  # every change to a box holds its one lock
        report = _run_pipeline(ctx, nodes, mode, on_start, on_result, parallel)
    swept = getattr(info, "swept", None)
    if swept:  # a killed run's temp files, removed before this run worked
        report.extra["removed_temps"] = swept
        con = getattr(ctx, "console", None)
        if con is not None:
            from .escape import rich

            con.print(
                f"[dim]removed {len(swept)} stale temp file(s) of a killed run: {rich(', '.join(swept))}[/]"
            )
    return report


def check_options(ctx, steps: Iterable[Step]) -> None:
    """Every step's options, read before any fact is gathered or the box is locked: a bad inventory
    value or option is bad input (GpuboxError: exit 2 from the CLI, a failed task from Ansible, the
    timer's exit 2) with nothing done, not one failed step after the others ran. Anything else an
    options() raises is left for the step itself to report when it runs (run_step)."""
    for step in steps:
        try:
            step.options(ctx)
        except GpuboxError:
            raise
        except Exception:
            pass


_GPUBOX_CMD = re.compile(r"(?<![\w./-])gpubox (?!-i )(?=[a-z])")


def hint_command(text: str | None, inventory: str | None) -> str | None:
    """A repair hint as the user must type it: every `gpubox CMD` in it gets the `-i PATH` the user
    gave on the command line (a hint without it would act on the default inventory, or fail)."""
    if not text or not inventory:
        return text
    import shlex

    return _GPUBOX_CMD.sub(lambda m: f"gpubox -i {shlex.quote(inventory)} ", text)


def _run_pipeline(ctx, nodes, mode, on_start, on_result, parallel) -> RunReport:
    nodes = list(nodes)
    forget = getattr(ctx, "forget", None)
    if forget is not None:  # facts are cached within one run, never across runs
        forget()
    _check_order(nodes)
    names = {n.name for n in nodes}
    shared = _Shared()
    t0 = time.monotonic()

    running: dict[str, str] = {}  # lane -> the step it runs now (said when Ctrl-C cuts it short)

    def run_lane(seq: list[Node], wait: bool = True) -> None:
        for node in seq:
            reqs = [r for r in node.requires if r in names]
            with shared.cond:
                if not wait:  # sequential: a requirement that has not run yet cannot block
                    reqs = [r for r in reqs if r in shared.results]
                shared.cond.wait_for(
                    lambda reqs=reqs: shared.error is not None or all(r in shared.results for r in reqs)
                )
                if shared.error is not None:
                    return
                bad = [r for r in reqs if shared.results[r].status not in (OK, FIXED)]
            if mode == "apply" and bad:
                res = blocked(node.step, ctx, bad)
            else:
                running[node.lane] = node.name
                if on_start:
                    on_start(node)
                try:
                    res = run_step(node.step, ctx, mode)
                except BaseException as exc:  # transport errors end the whole run (exit 2)
                    with shared.cond:
                        shared.error = exc
                        shared.cond.notify_all()
                    return
            res.repair = hint_command(res.repair, (getattr(ctx, "options", None) or {}).get("inventory_arg"))
            with shared.cond:
                shared.results[node.name] = res
                shared.cond.notify_all()
            if on_result:
                on_result(res)

    lanes: dict[str, list[Node]] = {}
    for n in nodes:
        lanes.setdefault(n.lane, []).append(n)

    def interrupted() -> Interrupted:
        """Ctrl-C: stop the lanes at their next step; say what ended and what was cut short."""
        with shared.cond:
            shared.error = shared.error or KeyboardInterrupt()
            shared.cond.notify_all()
            done = [shared.results[n.name] for n in nodes if n.name in shared.results]
            cut = [name for name in running.values() if name not in shared.results]
        return Interrupted(done, cut)

    try:
        if parallel and len(lanes) > 1:
            threads = [
                threading.Thread(target=run_lane, args=(seq,), name=f"lane-{lane}", daemon=True)
                for lane, seq in lanes.items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():  # a plain join() would not wake for SIGINT on every platform
                    t.join(0.2)
        else:
            # Sequential: walk the global order (which _check_order proved consistent).
            for n in nodes:
                run_lane([n], wait=False)
    except KeyboardInterrupt:
        raise interrupted() from None
    if isinstance(shared.error, KeyboardInterrupt):
        raise interrupted()
    if shared.error is not None:
        raise shared.error
    report = RunReport(box=getattr(getattr(ctx, "box", None), "name", "-"), mode=mode)
    report.steps = [shared.results[n.name] for n in nodes if n.name in shared.results]
    report.seconds = time.monotonic() - t0
    return report
