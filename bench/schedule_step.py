"""The schedule step: install (or confirm) the box's timer/cron entry; its removal is the
schedule-remove step (bench/schedule_remove_step.py), on the same Spec, options and evidence.

Facts (bench.schedule: TargetExists, TargetText, TimerState) are read on the schedule's target,
the Proxmox host or the container; `decide` is pure over them and the validated Spec, and its
Plan holds exactly the file writes, removals and systemctl calls apply runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox.steps import OMIT, Finding, Omit, Plan, Run, Step, Write

from .schedule import (
    DEFAULTS,
    TIMEOUT,
    Spec,
    TargetExists,
    TargetText,
    TimerState,
    file_paths,
    format_span,
    spec_from,
    wanted_files,
)

SYSTEMD_DIR = "/run/systemd/system"  # sd_booted(3): systemd runs there
DEFAULT_GPUBOX = DEFAULTS["gpubox"]  # where install.sh links it


def runs_systemd(ctx, s: Spec) -> bool:
    """uses_systemd through the fact cache: a forced mechanism reads nothing."""
    if s.mechanism != "auto":
        return s.mechanism == "systemd"
    return ctx.fact(TargetExists, s.on, SYSTEMD_DIR)


@dataclass
class Options:
    spec: Spec


@dataclass
class Evidence:
    mechanism: str | Omit = OMIT  # systemd | cron
    files: list[str] | Omit = OMIT
    on: str | Omit = OMIT  # container | host
    enabled: str | None | Omit = OMIT  # systemctl is-enabled <timer>
    active: str | None | Omit = OMIT  # systemctl is-active <timer>
    path: str | Omit = OMIT


# -- install -------------------------------------------------------------------------------------
@dataclass
class Facts:
    missing: list[str]  # prerequisites absent in the container (gpubox, inventory)
    systemd: bool = False  # the target runs systemd (or the mechanism says so)
    have: dict[str, str | None] | None = None  # each schedule file's text there (None: absent)
    enabled: str | None = None  # systemctl is-enabled <timer> (systemd only)
    active: str | None = None  # systemctl is-active <timer>
    target: str = ""  # the target's name (host or container)


def _prereq_failure(s: Spec, path: str) -> Finding:
    if path in (TIMEOUT, "/usr/bin/env"):
        return Finding.failed(
            f"{path} is not in {s.box}: the run on the host reaches the container through it",
            cause="every scheduled run would fail",
            repair=f"install coreutils in {s.box}",
            evidence=Evidence(path=path),
        )
    if path == s.gpubox:
        what, fix = (
            "gpubox",
            # pip into Debian's python3 is refused (PEP 668, externally managed): a venv does it
            f"install it in {s.box} with the checkout's ./install.sh (a venv in /opt/gpubox, linked as "
            f"{DEFAULT_GPUBOX}), or with `ansible-playbook playbooks/bench.yml -l {s.box}` (the "
            "gpubox_install role: /opt/gpubox/venv) and gpubox_schedule.gpubox: /opt/gpubox/venv/bin/gpubox",
        )
    else:
        what, fix = (
            "the inventory",
            (
                f"copy an inventory naming {s.box} with ansible_connection: local "
                "there, or set gpubox_schedule.inventory"
            ),
        )
    return Finding.failed(
        f"{what} is not at {path} in {s.box}",
        cause="the scheduled run would fail every time",
        repair=fix,
        evidence=Evidence(path=path),
    )


class SpecStep(Step):
    """A step about one schedule spec: it acts where the spec runs (the host or the container)."""

    where = "container"

    def __init__(self, spec: Spec | None = None):
        self.spec = spec
        if spec is not None:
            self.where = "host" if spec.on == "host" else "container"

    def options(self, ctx) -> Options:
        return Options(self.spec)


class ScheduleStep(SpecStep):
    """Install (or confirm) the box's timer/cron entry."""

    name = "schedule"
    title = "scheduled health check"
    where = "container"

    def gather(self, ctx) -> Facts:
        s = self.spec
        # gpubox and its inventory must be in the container, or every run would fail; nothing
        # else is read (no systemctl call) until they are.
        # with `on: host` the run goes through coreutils' timeout and env in the container
        tools = (TIMEOUT, "/usr/bin/env") if s.on == "host" else ()
        for path in (s.gpubox, s.inventory, *tools):
            if not ctx.fact(TargetExists, "container", path):
                return Facts(missing=[path])
        systemd = runs_systemd(ctx, s)
        have = {p: ctx.fact(TargetText, s.on, p) for p in file_paths(s, systemd)}
        st = ctx.fact(TimerState, s.on, s.timer) if systemd else {}
        target = ctx.host if s.on == "host" else ctx.container
        return Facts([], systemd, have, st.get("is-enabled"), st.get("is-active"), target.name)

    def decide(self, facts: Facts, opts: Options) -> Finding:
        s = opts.spec
        if facts.missing:
            return _prereq_failure(s, facts.missing[0])
        files = wanted_files(s, facts.systemd)
        have = facts.have or {}
        changed = {p: c for p, c in files.items() if have.get(p) != c}
        ev = Evidence(mechanism="systemd" if facts.systemd else "cron", files=sorted(files), on=s.on)
        problems = [f"{p} {'missing' if have.get(p) is None else 'differs'}" for p in changed]
        if facts.systemd:
            ev.enabled, ev.active = facts.enabled, facts.active
            if facts.enabled != "enabled":
                problems.append(f"{s.timer} is {facts.enabled}")
            if facts.active != "active":
                problems.append(f"{s.timer} is {facts.active}")
        if not problems:
            what = f"every {format_span(s.every)}" if s.every else s.on_calendar
            return Finding.ok(f"{ev.mechanism} runs the {s.profile} check {what}", evidence=ev)
        actions: list[Any] = [Write(p, c, old=have.get(p), mode=0o644) for p, c in changed.items()]
        if facts.systemd:
            if changed:
                actions.append(Run(["systemctl", "daemon-reload"], timeout=60))
            actions.append(Run(["systemctl", "enable", "--now", s.timer], timeout=60))
            names = ", ".join(p.rsplit("/", 1)[1] for p in changed) or "nothing new"
            desc = f"install {names} and enable {s.timer}"
        else:
            desc = f"write {s.cron_file} (cron: no systemd on {facts.target})"
        return Finding.drift(
            "; ".join(problems),
            repair=f"gpubox schedule install {s.box}",
            plan=Plan(desc, actions=actions),
            evidence=ev,
        )


def steps(ctx) -> list[Step]:
    """For the recover pipeline: the schedule step when the box asks for one (gpubox_schedule)."""
    if not ctx.box.var("gpubox_schedule"):
        return []
    return [ScheduleStep(spec_from(ctx.box))]
