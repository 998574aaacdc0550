"""The step model: facts -> decide -> plan -> apply -> verify, in the spirit of pyinfra
facts/operations and Ansible's check mode.

A step reads host state through facts (`gather`, cached per run on the context), then a pure
`decide(facts, options)` returns a Finding: ok / drift / failed with typed evidence, and for drift
the Plan that repairs it. A Plan holds exactly the actions apply runs (`Run` argv lists, `Write`
and `Remove` of files); what a dry run shows (`commands`, `diff`) is derived from those actions, so
the two cannot drift apart. `apply` executes the actions; `verify` forgets the facts and decides
again. The engine that drives steps (modes, requires, lanes) is `gpubox.pipeline`.

Steps that cannot be expressed as facts + actions (a container restart, the staging engine)
override `check`/`plan`/`apply`; the engine only ever calls those four verbs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .diffs import unified

OK, DRIFT, FIXED, FAILED, SKIPPED = "ok", "drift", "fixed", "failed", "skipped"
MODES = ("check", "plan", "apply")


class _Omit:
    """Marks an evidence field that this finding does not report (left out of the record)."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()


def evidence_dict(evidence: Any) -> dict[str, Any]:
    """The JSON record of a finding's evidence: a dataclass's fields (those not OMIT), or the
    dict as it is."""
    if dataclasses.is_dataclass(evidence) and not isinstance(evidence, type):
        return {
            f.name: _plain(getattr(evidence, f.name))
            for f in dataclasses.fields(evidence)
            if getattr(evidence, f.name) is not OMIT
        }
    return dict(evidence or {})


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return evidence_dict(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


@dataclass
class Finding:
    """What a step saw: status, a one-line detail, typed evidence, and for drift its Plan."""

    status: str  # ok | drift | failed
    detail: str
    evidence: Any = field(default_factory=dict)  # a dataclass, or a dict for small steps
    cause: str | None = None
    repair: str | None = None
    plan: "Plan | None" = None

    @classmethod
    def ok(cls, detail: str, evidence: Any = None, **kw) -> "Finding":
        return cls(OK, detail, _ev(evidence, kw))

    @classmethod
    def drift(
        cls,
        detail: str,
        cause: str | None = None,
        repair: str | None = None,
        *,
        plan: "Plan | None" = None,
        evidence: Any = None,
        **kw,
    ) -> "Finding":
        return cls(DRIFT, detail, _ev(evidence, kw), cause, repair, plan)

    @classmethod
    def failed(
        cls, detail: str, cause: str | None = None, repair: str | None = None, *, evidence: Any = None, **kw
    ) -> "Finding":
        return cls(FAILED, detail, _ev(evidence, kw), cause, repair)


def _ev(evidence: Any, kw: dict[str, Any]) -> Any:
    if evidence is None:
        return kw
    if kw:
        raise TypeError("give evidence as one object or as keywords, not both")
    return evidence


# --- plan actions: what apply runs, exactly -------------------------------------------------------


@dataclass(frozen=True)
class HostPath:
    """A path on the step's host inside an argv: shown and run with the host's root prefix
    (after `prefix`, for an option such as setpci's `sysfs.path=<path>`)."""

    path: str
    prefix: str = ""


@dataclass
class Run:
    """One argv on the step's host (or `where`). `after(host)` may read back and raise: a
    post-condition that runs no command of its own (e.g. PCIe bits outside 14:12 moved)."""

    argv: list[Any]
    input: str | bytes | None = None
    timeout: float = 60
    where: str | None = None
    after: Callable[[Any], None] | None = None
    become: bool = False  # as root (sudo) where the transport's user is not root

    def resolved(self, host) -> list[str]:
        return [a.prefix + host.path(a.path) if isinstance(a, HostPath) else str(a) for a in self.argv]


@dataclass
class Write:
    """Atomic write of a file, with a backup of its old content on the control node."""

    path: str
    text: str | bytes
    old: str | None = ""  # what the diff is shown against ("" = empty, None = /dev/null)
    mode: int | None = 0o644
    where: str | None = None

    def diff(self) -> str:
        new = self.text.decode() if isinstance(self.text, bytes) else self.text
        return unified(self.path, self.old, new)


@dataclass
class Remove:
    """Remove a file, keeping its old content as a backup on the control node."""

    path: str
    old: str = ""
    where: str | None = None

    def diff(self) -> str:
        return unified(self.path, self.old, "")


@dataclass
class Plan:
    """The exact change `apply` would make.

    New steps give `actions`; `commands` and `diff` then come from them. `commands`, `diff` and
    `data` given directly are for steps that override `apply` (their own payload)."""

    description: str = ""
    diff: str = ""
    commands: list[list[str]] = field(default_factory=list)
    data: Any = None
    actions: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.actions and not self.diff:
            self.diff = "".join(a.diff() for a in self.actions if isinstance(a, (Write, Remove)))

    @property
    def empty(self) -> bool:
        return not (self.diff or self.commands or self.data or self.actions)

    def shown_commands(self, host_for: Callable[[str | None], Any]) -> list[list[str]]:
        """The argv lists a dry run shows: the given ones, then every Run action resolved."""
        out = [list(c) for c in self.commands]
        out += [a.resolved(host_for(a.where)) for a in self.actions if isinstance(a, Run)]
        return out


def execute(plan: Plan, host_for: Callable[[str | None], Any], backup_for: Callable[[Any, str], Any]) -> None:
    """Run a plan's actions in order; the first failure stops the rest (it raises)."""
    for a in plan.actions:
        host = host_for(a.where)
        if isinstance(a, Run):
            host.run(a.resolved(host), input=a.input, timeout=a.timeout, become=a.become, check=True)
            if a.after is not None:
                a.after(host)
        elif isinstance(a, Write):
            host.write(a.path, a.text, mode=a.mode)
        elif isinstance(a, Remove):
            from .safeio import write_atomic

            # tmp + rename: a full backup directory leaves no 0-byte "backup" behind (ENOSPC names it)
            write_atomic(backup_for(host, a.path), host.read_bytes(a.path), mode=0o600)
            host.remove(a.path)
        else:
            raise TypeError(f"unknown plan action {a!r}")


class Step:
    """Base class. Subclasses set `name`, `where` ("host" | "container"), `requires` (names of
    steps that must end ok/fixed first in apply mode) and either `gather` + `decide`, or the
    verbs `check` / `plan` / `apply` themselves. `lane` (default: `where`) is the pipeline lane."""

    name: str = "step"
    title: str = ""
    where: str = "host"
    requires: tuple[str, ...] = ()
    lane: str | None = None
    # A measurement of the box, not a repair (the benchmark): recover runs it after the repairs
    # instead of as a pipeline step, and doctor reports a missing measurement as no fault.
    measures: bool = False

    # -- facts and decision ------------------------------------------------------------------
    def gather(self, ctx) -> Any:
        """Read this step's facts (through `ctx.fact`); the only part that touches a host."""
        raise NotImplementedError

    def options(self, ctx) -> Any:
        """The desired state: inventory variables and command-line options this step reads."""
        return dict(getattr(ctx, "options", {}) or {})

    def decide(self, facts: Any, options: Any) -> Finding:
        """Pure: facts and options in, a Finding (with its Plan when it is drift) out."""
        raise NotImplementedError

    # -- the verbs the engine calls --------------------------------------------------------------
    def check(self, ctx) -> Finding:
        # Options first: a bad value is bad input before anything is read from the box.
        opts = self.options(ctx)
        return self.decide(self.gather(ctx), opts)

    def plan(self, ctx, finding: Finding) -> Plan:
        return finding.plan or Plan()

    def apply(self, ctx, plan: Plan) -> None:
        from .state import backup_path

        execute(plan, lambda where: self.host_for(ctx, where), lambda h, p: backup_path(h.name, p))

    def verify(self, ctx) -> Finding:
        forget = getattr(ctx, "forget", None)
        if forget is not None:
            forget()
        return self.check(ctx)

    # -- where it acts -------------------------------------------------------------------------
    def host_for(self, ctx, where: str | None = None):
        return ctx.host if (where or self.where) == "host" else ctx.container

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
        """No problem remains and something was checked: every step ok, fixed, or skipped for a
        reason that is not a block, and not every step skipped. Skipped is its own status: a
        run where nothing could be checked (a probe with no GPU, no NVML) is not "ok"."""
        for s in self.steps:
            if s.status in (DRIFT, FAILED):
                return False
            if s.status == SKIPPED and s.evidence.get("blocked_by"):
                return False
        return not self.steps or any(s.status != SKIPPED for s in self.steps)

    def recap(self) -> dict[str, int]:
        """Counts per outcome, as Ansible's PLAY RECAP: ok (checked, nothing to do), changed
        (repaired and verified), drift (would change / still needs it), failed, blocked (not run:
        a step it requires did not end ok), skipped (could not run, or nothing to check)."""
        out = dict.fromkeys(("ok", "changed", "drift", "failed", "blocked", "skipped"), 0)
        for s in self.steps:
            if s.status == SKIPPED:
                out["blocked" if s.evidence.get("blocked_by") else "skipped"] += 1
            else:
                key = "changed" if s.status == FIXED else s.status
                out[key] = out.get(key, 0) + 1
        return out

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        d = {
            "box": self.box,
            "mode": self.mode,
            "ok": self.ok,
            "changed": self.changed,
            "recap": self.recap(),
            "seconds": round(self.seconds, 4),
            "steps": [s.to_dict() for s in self.steps],
        }
        d.update(self.extra)
        return d
