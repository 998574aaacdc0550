"""The schedule's steps: install (or confirm) and remove the box's timer/cron entry.

Facts (bench.schedule: TargetExists, TargetText, TimerState) are read on the schedule's target,
the Proxmox host or the container; `decide` is pure over them and the validated Spec, and its
Plan holds exactly the file writes, removals and systemctl calls apply runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox.diffs import unified
from gpubox.steps import OMIT, Finding, Omit, Plan, Remove, Run, Step, Write

from .schedule import (
    DEFAULTS,
    UNIT_DIR,
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


def _systemd(ctx, s: Spec) -> bool:
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


class _SpecStep(Step):
    """A step about one schedule spec: it acts where the spec runs (the host or the container)."""

    where = "container"

    def __init__(self, spec: Spec | None = None):
        self.spec = spec
        if spec is not None:
            self.where = "host" if spec.on == "host" else "container"

    def options(self, ctx) -> Options:
        return Options(self.spec)


class ScheduleStep(_SpecStep):
    """Install (or confirm) the box's timer/cron entry."""

    name = "schedule"
    title = "scheduled health check"
    where = "container"

    def gather(self, ctx) -> Facts:
        s = self.spec
        # gpubox and its inventory must be in the container, or every run would fail; nothing
        # else is read (no systemctl call) until they are.
        for path in (s.gpubox, s.inventory):
            if not ctx.fact(TargetExists, "container", path):
                return Facts(missing=[path])
        systemd = _systemd(ctx, s)
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


# -- remove --------------------------------------------------------------------------------------
class RemoveFile(Remove):
    """A removal shown as git shows a deleted file (+++ /dev/null), as `schedule remove` always has."""

    def diff(self) -> str:
        return unified(self.path, self.old, None)


@dataclass
class RemoveFacts:
    present: dict[str, str]  # the schedule's files there (units and cron line) and their text
    systemd: bool = False  # the target runs systemd (read only when units are present)
    # the node_exporter textfile the checks wrote: (where, path, text), None when absent. Left
    # behind, node_exporter would export the last verdict ("healthy") for ever.
    prom: tuple[str, str, str] | None = None


def prom_file(box) -> tuple[str, str]:
    """(where, path) of the box's .prom textfile, as run-once writes it (bench.runonce)."""
    from . import prom

    where = str(box.var("gpubox_prometheus_on", "container"))
    return where, prom.textfile_path(box.name, box.var("gpubox_prometheus_textfile_dir", prom.DEFAULT_DIR))


class RemoveStep(_SpecStep):
    """Disable and delete the box's timer/cron entry."""

    name = "schedule-remove"
    title = "remove scheduled health check"
    where = "container"

    def gather(self, ctx) -> RemoveFacts:
        s = self.spec
        paths = [f"{UNIT_DIR}/{s.service}", f"{UNIT_DIR}/{s.timer}", s.cron_file]
        present = {p: ctx.fact(TargetText, s.on, p) for p in paths if ctx.fact(TargetExists, s.on, p)}
        units = any(p.startswith(UNIT_DIR) for p in present)
        where, path = prom_file(ctx.box)
        prom = (
            (where, path, ctx.fact(TargetText, where, path) or "")
            if ctx.fact(TargetExists, where, path)
            else None
        )
        return RemoveFacts({p: t or "" for p, t in present.items()}, units and _systemd(ctx, s), prom)

    def decide(self, facts: RemoveFacts, opts: Options) -> Finding:
        s = opts.spec
        present = list(facts.present)
        if not present and facts.prom is None:
            return Finding.ok("no scheduled health check installed", evidence=Evidence(files=[]))
        units = [p for p in present if p.startswith(UNIT_DIR)]
        removes = [RemoveFile(p, old=facts.present[p]) for p in present]
        if facts.prom is not None:
            where, path, text = facts.prom
            removes.append(RemoveFile(path, old=text, where=where))
            present.append(path)
        if units and facts.systemd:
            actions = [
                Run(["systemctl", "disable", "--now", s.timer], timeout=60),
                *removes,
                Run(["systemctl", "daemon-reload"], timeout=60),
            ]
            desc = f"disable {s.timer} and delete {len(present)} file(s)"
        else:
            actions, desc = list(removes), f"delete {', '.join(present)}"
        return Finding.drift(
            f"installed: {', '.join(present)}",
            plan=Plan(desc, actions=actions),
            evidence=Evidence(files=present),
        )


def steps(ctx) -> list[Step]:
    """For the recover pipeline: the schedule step when the box asks for one (gpubox_schedule)."""
    if not ctx.box.var("gpubox_schedule"):
        return []
    return [ScheduleStep(spec_from(ctx.box))]
