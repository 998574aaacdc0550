"""The autostart steps: install (or confirm) and remove the boot unit, the hookscript and the server gate.

Facts are the files on the Proxmox host (the snippet, the unit, the container's config and
storage.cfg), the unit's enablement and, with a server unit, the drop-in in the container. The
config's `hookscript:` is set and restored only with `pct set` (Proxmox writes its own config);
the line it replaced is recorded in the snippet, so remove puts back exactly that line or its absence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox import bootbins
from gpubox.diffs import unified
from gpubox.facts import Fact, FileText
from gpubox.steps import OMIT, Finding, Omit, Plan, Remove, Run, Step, Write

from . import autostart as a
from .lxc import ConfText


class ContainerText(Fact):
    """A file's text in the container, "" when absent."""

    where = "container"

    @staticmethod
    def read(host, path: str) -> str:
        return host.read_text(path, default="")


class UnitEnabled(Fact):
    """`systemctl is-enabled <unit>` on the host."""

    @staticmethod
    def read(host, unit: str) -> str:
        r = host.run(["systemctl", "is-enabled", unit], timeout=20)
        return "no systemctl" if r.rc == 127 else ((r.stdout.strip().splitlines() or ["unknown"])[0])


@dataclass
class Options:
    spec: a.Spec
    gates: list[str]


@dataclass
class Evidence:
    hookscript: str | None | Omit = OMIT  # the CT's hookscript volid (None: none attached)
    previous: str | None | Omit = OMIT  # the `hookscript:` line gpubox's snippet replaced
    chain: str | None | Omit = OMIT  # that hookscript's path on the host, run first
    unit: str | Omit = OMIT  # the boot unit
    enabled: str | Omit = OMIT  # systemctl is-enabled <unit>
    files: list[str] | Omit = OMIT


class HostExists(Fact):
    @staticmethod
    def read(host, path: str) -> bool:
        return host.exists(path)


@dataclass
class Facts:
    missing: list[str]  # gpubox or its inventory absent on the host: every hook would fail
    conf: str
    storage_cfg: str
    snippet: str  # "" when absent
    unit: str
    enabled: str
    dropin: str | None  # None without a server unit
    programs: list[str] | None = None  # other programs the unit and hookscript run, absent on the host


def _gather(ctx, s: a.Spec) -> Facts:
    storage_cfg = ctx.fact(FileText, "/etc/pve/storage.cfg")
    snippet = ""
    path = a.volid_path(s.volid, storage_cfg)
    if path:
        snippet = ctx.fact(FileText, path)
    return Facts(
        # a simulated box runs this machine's gpubox and inventory (spec_from), not paths under its root
        missing=[]
        if ctx.box.var("gpubox_simulated", False)
        else [p for p in (s.gpubox, s.inventory) if not ctx.fact(HostExists, p)],
        conf=ctx.fact(ConfText, s.vmid),
        storage_cfg=storage_cfg,
        snippet=snippet,
        unit=ctx.fact(FileText, s.unit_path),
        enabled=ctx.fact(UnitEnabled, s.unit),
        dropin=ctx.fact(ContainerText, s.dropin_path) if s.dropin_path else None,
        programs=[]
        if ctx.box.var("gpubox_simulated", False)
        else [
            p
            for p in bootbins.missing(ctx.fact, [a.render_snippet(s, None, None), a.render_unit(s)])
            if p != s.gpubox  # named with its own repair above
        ],
    )


class _SpecStep(Step):
    where = "host"

    def __init__(self, spec: a.Spec | None = None):
        self.spec = spec

    def options(self, ctx) -> Options:
        return Options(self.spec, a.gate_paths(ctx.box))

    def gather(self, ctx) -> Facts:
        return _gather(ctx, self.spec)


def _pct_set(s: a.Spec, value: str | None) -> Run:
    argv = ["pct", "set", str(s.vmid)] + (["--hookscript", value] if value else ["--delete", "hookscript"])
    return Run(argv, timeout=60)


class InstallStep(_SpecStep):
    """Boot unit + hookscript (+ server gate) in place, enabled and attached."""

    name = "autostart"
    title = "reboot-safe (autostart)"

    def decide(self, facts: Facts, opts: Options) -> Finding:
        s = opts.spec
        if facts.missing:
            return Finding.failed(
                f"{facts.missing[0]} is not on CT {s.vmid}'s Proxmox host: the boot unit and the hookscript run it there",
                cause="autostart runs gpubox on the host",
                repair="install gpubox there (./install.sh, or playbooks/install.yml) with an inventory naming "
                f"{s.box} (ansible_connection: local), or set gpubox_autostart.gpubox / .inventory",
            )
        if facts.programs:
            detail, cause, repair = bootbins.refusal(facts.programs, f"the boot unit {s.unit} / hookscript")
            return Finding.failed(detail, cause=cause, repair=repair)
        spath = a.snippet_path(s, facts.storage_cfg)
        line = a.hookscript_line(facts.conf)
        value = a.hookscript_value(line)
        ours = value == s.volid
        if ours:  # installed before: keep the record of what it replaced
            _, previous = a.recorded_previous(facts.snippet)
        else:
            previous = line
        chain = None
        if previous is not None:
            prev_value = a.hookscript_value(previous)
            chain = a.volid_path(prev_value, facts.storage_cfg)
            if s.existing == "refuse" or chain is None:
                why = (
                    "gpubox_autostart.existing is refuse"
                    if chain is not None
                    else f"{prev_value} is not on a directory storage gpubox can call"
                )
                return Finding.failed(
                    f"CT {s.vmid} already has hookscript {prev_value}; gpubox never replaces it ({why})",
                    cause="a hookscript of yours is attached",
                    repair="set gpubox_autostart.existing: chain (gpubox runs yours first with the same "
                    "argv and honours its exit), or detach yours with pct set --delete hookscript",
                    evidence=Evidence(hookscript=prev_value),
                )
        files = {spath: a.render_snippet(s, previous, chain), s.unit_path: a.render_unit(s)}
        have = {spath: facts.snippet, s.unit_path: facts.unit}
        actions: list[Any] = [
            Write(p, t, old=have[p] or None, mode=0o755 if p == spath else 0o644)
            for p, t in files.items()
            if have[p] != t
        ]
        problems = [
            f"{p} {'missing' if not have[p] else 'differs'}" for p, t in files.items() if have[p] != t
        ]
        if any(isinstance(x, Write) and x.path == s.unit_path for x in actions):
            actions.append(Run(["systemctl", "daemon-reload"], timeout=60))
        if facts.enabled != "enabled":
            problems.append(f"{s.unit} is {facts.enabled}")
            actions.append(Run(["systemctl", "enable", s.unit], timeout=60))
        if s.dropin_path:
            text = a.render_dropin(s, opts.gates)
            if facts.dropin != text:
                problems.append(
                    f"{s.dropin_path} in the container {'differs' if facts.dropin else 'missing'}"
                )
                actions.append(Write(s.dropin_path, text, old=facts.dropin or None, where="container"))
                actions.append(Run(["systemctl", "daemon-reload"], timeout=60, where="container"))
        if not ours:
            problems.append(f"CT {s.vmid} hookscript is {value or 'not set'}")
            actions.append(_pct_set(s, s.volid))
        ev = Evidence(
            hookscript=value,
            previous=previous,
            chain=chain,
            unit=s.unit,
            enabled=facts.enabled,
            files=sorted(files) + ([s.dropin_path] if s.dropin_path else []),
        )
        if not problems:
            return Finding.ok("reboot-safe: yes (" + a.describe(s) + ")", evidence=ev)
        return Finding.drift(
            "reboot-safe: no: staging is manual (" + "; ".join(problems) + ")",
            repair=f"gpubox autostart install {s.box}",
            plan=Plan("install " + a.describe(s) + (f", chaining {chain}" if chain else ""), actions=actions),
            evidence=ev,
        )


class _RemoveFile(Remove):
    def diff(self) -> str:
        return unified(self.path, self.old, None)


class RemoveStep(_SpecStep):
    """Detach the hookscript (the line it replaced put back), disable and delete the unit, the
    snippet and the gate."""

    name = "autostart-remove"
    title = "remove autostart"

    def decide(self, facts: Facts, opts: Options) -> Finding:
        s = opts.spec
        spath = a.volid_path(s.volid, facts.storage_cfg)
        value = a.hookscript_value(a.hookscript_line(facts.conf))
        actions: list[Any] = []
        present = []
        notes = ""
        if value == s.volid:
            found, previous = a.recorded_previous(facts.snippet)
            if not found:
                return Finding.failed(
                    f"{spath} has no record of the hookscript line it replaced",
                    repair=f"set it yourself: pct set {s.vmid} --delete hookscript (or --hookscript VOLID)",
                )
            actions.append(_pct_set(s, a.hookscript_value(previous)))
            present.append(f"hookscript {s.volid}")
        elif value is not None:
            notes = f" (hookscript {value} is not gpubox's: left as it is)"
        if facts.enabled == "enabled":
            actions.append(Run(["systemctl", "disable", s.unit], timeout=60))
        for path, text, where in (
            (s.unit_path, facts.unit, None),
            (spath, facts.snippet, None),
            (s.dropin_path, facts.dropin, "container"),
        ):
            if path and text:
                actions.append(_RemoveFile(path, old=text, where=where))
                present.append(path)
        if facts.unit:
            actions.append(Run(["systemctl", "daemon-reload"], timeout=60))
        if not actions:
            return Finding.ok("autostart not installed" + notes, evidence=Evidence(files=[]))
        return Finding.drift(
            "installed: " + ", ".join(present) + notes,
            plan=Plan(f"remove autostart of CT {s.vmid}", actions=actions),
            evidence=Evidence(files=present),
        )


def reboot_safe(ctx) -> tuple[bool, str]:
    """doctor's summary line: is a reboot handled with no command typed? (a summary, not a step:
    a box without autostart is not unhealthy)"""
    from gpubox.errors import GpuboxError
    from gpubox.pipeline import run_steps

    try:
        inv = ctx.inventory.path if ctx.inventory is not None else None
        report = run_steps(ctx, [InstallStep(a.spec_from(ctx.box, str(inv) if inv else None))], "check")
    except GpuboxError as exc:
        return False, f"no: {exc}"
    s = report.steps[0]
    if s.status == "ok":
        return True, "yes"
    return False, "no: staging is manual" + (f" ({s.detail.split('(', 1)[1]}" if "(" in s.detail else "")
