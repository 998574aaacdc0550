"""The step model: check -> plan -> apply -> verify, in the spirit of pyinfra facts/operations and
Ansible's check mode.

A Step reads state (`check` returns a Finding: ok / drift / failed, with evidence), turns drift
into a concrete Plan (a unified diff and/or exact argv lists, no side effects), applies it, and
re-reads to prove it took. `run_steps` drives a list of steps in one of three modes:

- "check": doctor; checks only.
- "plan":  --dry-run; check + plan, nothing is changed.
- "apply": check, plan, apply, verify; a step whose `requires` did not end ok/fixed is skipped.

Every outcome is a StepResult that renders as a table row or as JSON.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from .errors import GpuboxError, TransportError

OK, DRIFT, FIXED, FAILED, SKIPPED = "ok", "drift", "fixed", "failed", "skipped"
MODES = ("check", "plan", "apply")


@dataclass
class Finding:
    """What `check` saw."""

    status: str  # ok | drift | failed
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    repair: str | None = None

    @classmethod
    def ok(cls, detail: str, **evidence) -> "Finding":
        return cls(OK, detail, evidence)

    @classmethod
    def drift(cls, detail: str, cause: str | None = None, repair: str | None = None, **evidence) -> "Finding":
        return cls(DRIFT, detail, evidence, cause, repair)

    @classmethod
    def failed(cls, detail: str, cause: str | None = None, repair: str | None = None, **evidence) -> "Finding":
        return cls(FAILED, detail, evidence, cause, repair)


@dataclass
class Plan:
    """The exact change `apply` would make. `data` is the step's own payload for `apply`."""

    description: str = ""
    diff: str = ""
    commands: list[list[str]] = field(default_factory=list)
    data: Any = None

    @property
    def empty(self) -> bool:
        return not (self.diff or self.commands or self.data)


class Step:
    """Base class. Subclasses set `name`, `where` ("host" | "container") and the four verbs."""

    name: str = "step"
    title: str = ""
    where: str = "host"
    requires: tuple[str, ...] = ()

    def check(self, ctx) -> Finding:
        raise NotImplementedError

    def plan(self, ctx, finding: Finding) -> Plan:
        return Plan()

    def apply(self, ctx, plan: Plan) -> None:
        raise NotImplementedError

    def verify(self, ctx) -> Finding:
        return self.check(ctx)

    def host_name(self, ctx) -> str:
        try:
            return ctx.box.host.name if self.where == "host" else ctx.box.container.name
        except AttributeError:
            return "-"


@dataclass
class StepResult:
    name: str
    host: str
    status: str
    changed: bool = False
    detail: str = ""
    diff: str = ""
    commands: list[list[str]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    repair: str | None = None
    seconds: float = 0.0
    title: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 4)
        return d


@dataclass
class RunReport:
    box: str
    mode: str
    steps: list[StepResult] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No problem remains: every step ok, fixed, or skipped for a reason that is not a block."""
        for s in self.steps:
            if s.status in (DRIFT, FAILED):
                return False
            if s.status == SKIPPED and s.evidence.get("blocked_by"):
                return False
        return True

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        d = {"box": self.box, "mode": self.mode, "ok": self.ok, "changed": self.changed,
             "seconds": round(self.seconds, 4), "steps": [s.to_dict() for s in self.steps]}
        d.update(self.extra)
        return d


def _result_from(step: Step, ctx, f: Finding, status: str | None = None, **kw) -> StepResult:
    return StepResult(name=step.name, title=step.title or step.name, host=step.host_name(ctx),
                      status=status or f.status, detail=f.detail, evidence=f.evidence,
                      cause=f.cause, repair=f.repair, **kw)


def run_step(step: Step, ctx, mode: str) -> StepResult:
    """One step through the verbs the mode allows. Transport errors propagate (cannot run: exit 2)."""
    t0 = time.monotonic()
    try:
        f = step.check(ctx)
        if f.status != DRIFT or mode == "check":
            res = _result_from(step, ctx, f)
        else:
            plan = step.plan(ctx, f)
            if mode == "plan":
                res = _result_from(step, ctx, f, diff=plan.diff, commands=plan.commands)
                if plan.description:
                    res.detail = f"{f.detail}; would {plan.description}"
            else:
                step.apply(ctx, plan)
                v = step.verify(ctx)
                status = FIXED if v.status == OK else FAILED
                res = _result_from(step, ctx, v, status=status, changed=True, diff=plan.diff,
                                   commands=plan.commands)
                if status == FIXED:
                    res.detail = f"{f.detail} -> {plan.description or 'repaired'}; verified: {v.detail}"
                    res.cause = f.cause
                else:
                    res.detail = f"applied but verify says: {v.detail}"
                    res.cause = v.cause or f.cause
                    res.repair = v.repair or f.repair
    except TransportError:
        raise
    except GpuboxError as exc:
        res = StepResult(step.name, step.host_name(ctx), FAILED, detail=str(exc), title=step.title or step.name)
    except OSError as exc:     # EROFS, EPERM (immutable), ENOSPC, ENOTDIR...: the cause, not "internal error"
        from .errors import os_error
        err = os_error(exc)
        res = StepResult(step.name, step.host_name(ctx), FAILED, detail=err.problem,
                         title=step.title or step.name, repair=err.fix)
    except UnicodeDecodeError as exc:
        res = StepResult(step.name, step.host_name(ctx), FAILED, title=step.title or step.name,
                         detail=f"input is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
                                f"at offset {exc.start}",
                         repair="fix or re-save the file as UTF-8")
    except Exception as exc:  # a bug or an unexpected state: report it on the step, keep going
        if getattr(ctx, "verbose", False):
            traceback.print_exc()
        res = StepResult(step.name, step.host_name(ctx), FAILED, title=step.title or step.name,
                         detail=f"internal error: {type(exc).__name__}: {exc}",
                         repair="re-run with -v for the traceback and report it")
    res.seconds = time.monotonic() - t0
    return res


def run_steps(ctx, steps: Iterable[Step], mode: str = "check",
              on_result: Callable[[StepResult], None] | None = None) -> RunReport:
    """Run steps in order; in apply mode a step is skipped when a step it requires did not end well."""
    if mode not in MODES:
        raise ValueError(mode)
    from .boxlock import lock_for
    with lock_for(ctx, mode):       # every change to a box holds its one lock
        return _run_steps(ctx, steps, mode, on_result)


def _run_steps(ctx, steps, mode, on_result) -> RunReport:
    t0 = time.monotonic()
    report = RunReport(box=getattr(getattr(ctx, "box", None), "name", "-"), mode=mode)
    final: dict[str, str] = {}
    for step in steps:
        bad = [r for r in step.requires if r in final and final[r] not in (OK, FIXED)]
        if mode == "apply" and bad:
            res = StepResult(step.name, step.host_name(ctx), SKIPPED, title=step.title or step.name,
                             detail=f"blocked: {', '.join(bad)} did not end ok",
                             evidence={"blocked_by": bad},
                             repair=f"fix {', '.join(bad)} first, then re-run")
        else:
            res = run_step(step, ctx, mode)
        final[step.name] = res.status
        report.steps.append(res)
        if on_result:
            on_result(res)
    report.seconds = time.monotonic() - t0
    return report
