"""The step model: facts -> decide -> plan -> apply -> verify, in the spirit of pyinfra
facts/operations and Ansible's check mode.

A step reads host state through facts (`gather`, cached per run on the context), then a pure
`decide(facts, options)` returns a Finding: ok / drift / failed with typed evidence, and for drift
the Plan that repairs it. A Plan is a description and a list of actions, nothing else: every change
is an `Action` with describe / diff / execute, as pyinfra's command types are (`Run` argv lists,
`Write` and `Remove` of files, and the areas' own: the container config commit, the container
restart with its consent, the staging copy, the benchmark run). What a dry run shows (`commands`,
`diff`) is each action's describe() and diff(), and apply runs the same objects' execute(), so the
two cannot drift apart. An action that must read the box to say exactly what it will do (the
copier's dry run, the server command lines) does so in `prepare`, in plan and apply modes only.
`verify` forgets the facts and decides again, unless an action judges its own outcome (a
measurement). The verbs check / plan / apply / verify are the base class's, for every step; the
engine that drives steps (option checks first, modes, requires, lanes) is `gpubox.pipeline`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Union

from .diffs import unified

OK, DRIFT, FIXED, FAILED, SKIPPED = "ok", "drift", "fixed", "failed", "skipped"
MODES = ("check", "plan", "apply")


class Omit:
    """Marks an evidence field that this finding does not report (left out of the record): an
    evidence field typed `list[str] | Omit` is a list of strings where the finding reports it."""

    def __repr__(self) -> str:
        return "OMIT"


_Omit = Omit  # the earlier name
OMIT = Omit()


class EvidenceRecord(Protocol):
    """A step's evidence: a dataclass whose fields (those not OMIT) are the finding's JSON record,
    in field order; each step declares its own (e.g. provision.lxc_step.ConfigEvidence)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


# A step's evidence dataclass, or for a small step its fields as keywords (a dict)
Evidence = Union[EvidenceRecord, dict[str, Any]]


def evidence_dict(evidence: Evidence | None) -> dict[str, Any]:
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
    evidence: Evidence = field(
        default_factory=dict
    )  # the step's evidence dataclass, or a dict for small steps
    cause: str | None = None
    repair: str | None = None
    plan: "Plan | None" = None

    @classmethod
    def ok(cls, detail: str, evidence: Evidence | None = None, **kw: Any) -> "Finding":
        return cls(OK, detail, _ev(evidence, kw))

    @classmethod
    def drift(
        cls,
        detail: str,
        cause: str | None = None,
        repair: str | None = None,
        *,
        plan: "Plan | None" = None,
        evidence: Evidence | None = None,
        **kw: Any,
    ) -> "Finding":
        return cls(DRIFT, detail, _ev(evidence, kw), cause, repair, plan)

    @classmethod
    def failed(
        cls,
        detail: str,
        cause: str | None = None,
        repair: str | None = None,
        *,
        evidence: Evidence | None = None,
        **kw: Any,
    ) -> "Finding":
        return cls(FAILED, detail, _ev(evidence, kw), cause, repair)


def _ev(evidence: Evidence | None, kw: dict[str, Any]) -> Evidence:
    if evidence is None:
        return kw
    if kw:
        raise TypeError("give evidence as one object or as keywords, not both")
    return evidence


# --- plan actions: what apply runs, exactly -------------------------------------------------------


class Action:
    """One change a plan makes, in the spirit of pyinfra's command types: what a dry run shows
    and what apply runs come from the same object, so the two cannot drift apart.

    - `prepare(run)`: read what a dry run must show before it can be shown (the copier's dry run,
      the server command lines, which read the GPU topology); called in plan and apply modes only,
      so a check (doctor) never pays for it; `summary()` then says what the action will do, for a
      plan that has no description of its own;
    - `describe(host)`: the argv lists a dry run shows (none for a file write: its diff shows it);
    - `diff()`: the text diff a dry run shows ("" when the action changes no file);
    - `execute(run)`: make the change (`run` is the Execution: hosts, backups, the context); a
      failure raises, which stops the plan;
    - `verified(recheck)`: the finding after the change; by default `recheck()` (facts forgotten,
      checked again). A measurement is judged by its own result instead, and an action that
      returned a summary adds it to the re-checked finding.
    `where` is the place it acts on ("host"/"container"; None: the step's own)."""

    where: str | None = None

    def prepare(self, run: "Execution") -> None:
        return None

    def summary(self) -> str:
        return ""

    def describe(self, host) -> list[list[str]]:
        return []

    def diff(self) -> str:
        return ""

    def execute(self, run: "Execution") -> None:
        raise NotImplementedError

    def verified(self, recheck: Callable[[], "Finding"]) -> "Finding":
        return recheck()


@dataclass
class Execution:
    """What an action executes with: the host for a place, the backup path of a file on the
    control node, and the run's context (options, consent, console) for the actions that ask."""

    host_for: Callable[[str | None], Any]
    backup_for: Callable[[Any, str], Any]
    ctx: Any = None

    def host(self, where: str | None = None):
        return self.host_for(where)


@dataclass(frozen=True)
class HostPath:
    """A path on the step's host inside an argv: shown and run with the host's root prefix
    (after `prefix`, for an option such as setpci's `sysfs.path=<path>`)."""

    path: str
    prefix: str = ""


@dataclass
class Run(Action):
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

    def describe(self, host) -> list[list[str]]:
        return [self.resolved(host)]

    def execute(self, run: "Execution") -> None:
        host = run.host(self.where)
        host.run(self.resolved(host), input=self.input, timeout=self.timeout, become=self.become, check=True)
        if self.after is not None:
            self.after(host)


@dataclass
class Write(Action):
    """Atomic write of a file, with a backup of its old content on the control node."""

    path: str
    text: str | bytes
    old: str | None = ""  # what the diff is shown against ("" = empty, None = /dev/null)
    mode: int | None = 0o644
    where: str | None = None

    def diff(self) -> str:
        new = self.text.decode() if isinstance(self.text, bytes) else self.text
        return unified(self.path, self.old, new)

    def execute(self, run: "Execution") -> None:
        run.host(self.where).write(self.path, self.text, mode=self.mode)


@dataclass
class Remove(Action):
    """Remove a file, keeping its old content as a backup on the control node."""

    path: str
    old: str = ""
    where: str | None = None

    def diff(self) -> str:
        return unified(self.path, self.old, "")

    def execute(self, run: "Execution") -> None:
        from .safeio import write_atomic

        host = run.host(self.where)
        # tmp + rename: a full backup directory leaves no 0-byte "backup" behind (ENOSPC names it)
        from .host import BACKUP_LIMIT

        old = host.read_bounded(self.path, BACKUP_LIMIT)  # a link, FIFO or device there: refused
        write_atomic(run.backup_for(host, self.path), old, mode=0o600)
        host.remove(self.path)


@dataclass
class Refuse(Action):
    """A drift apply cannot repair in place: executing it refuses with the reason and the fix
    (GpuboxError), so the record says why instead of "applied but verify says" the same fault."""

    problem: str
    fix: str | None = None

    def execute(self, run: "Execution") -> None:
        from .errors import GpuboxError

        raise GpuboxError(self.problem, self.fix)


@dataclass
class Plan:
    """The exact change `apply` would make: a description and the actions, nothing else. What a
    dry run shows (`diff`, `commands`) is derived from the actions."""

    description: str = ""
    actions: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        bad = [a for a in self.actions if not isinstance(a, Action)]
        if bad:
            raise TypeError(f"a plan holds actions only, not {bad[0]!r}")

    @property
    def diff(self) -> str:
        return "".join(a.diff() for a in self.actions)

    def prepare(self, run: "Execution") -> "Plan":
        """Prepare every action (Action.prepare); a plan given no description takes its actions'."""
        for a in self.actions:
            a.prepare(run)
        if not self.description:
            self.description = ", ".join(t for t in (a.summary() for a in self.actions) if t)
        return self

    def shown_commands(self, host_for: Callable[[str | None], Any]) -> list[list[str]]:
        """The argv lists a dry run shows: every action's, resolved on its host, in order."""
        return [list(argv) for a in self.actions for argv in a.describe(host_for(a.where))]


def execute(plan: Plan, run: Execution) -> None:
    """Run a plan's actions in order; the first failure stops the rest (it raises)."""
    for a in plan.actions:
        a.execute(run)


def verified(plan: Plan | None, recheck: Callable[[], "Finding"]) -> "Finding":
    """The finding after a plan ran: each action may judge it (a measurement by its own result)
    or add to it (a copy's summary); by default the facts are forgotten and checked again."""
    check = recheck
    for a in reversed(plan.actions if plan is not None else []):
        check = functools.partial(a.verified, check)
    return check()


class Step:
    """Base class. Subclasses set `name`, `where` ("host" | "container"), `requires` (names of
    steps that must end ok/fixed first in apply mode), `options`, `gather` and `decide`; the verbs
    the engine calls (`check`, `plan`, `apply`, `verify`) are these, for every step: what a step
    changes is in its Plan's actions. `lane` (default: `where`) is the pipeline lane."""

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
        """The finding's plan, its actions prepared (what a dry run shows is then exact)."""
        return (finding.plan or Plan()).prepare(self.execution(ctx))

    def apply(self, ctx, plan: Plan) -> None:
        execute(plan, self.execution(ctx))

    def execution(self, ctx) -> Execution:
        """What this step's actions execute with: its hosts, backups on the control node, ctx."""
        from .state import backup_path

        return Execution(lambda where: self.host_for(ctx, where), lambda h, p: backup_path(h.name, p), ctx)

    def verify(self, ctx, plan: Plan | None = None) -> Finding:
        """The finding after `plan` ran: the actions' judgement (Action.verified), by default the
        facts forgotten and checked again."""

        def recheck() -> Finding:
            forget = getattr(ctx, "forget", None)
            if forget is not None:
                forget()
            return self.check(ctx)

        return verified(plan, recheck)

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
