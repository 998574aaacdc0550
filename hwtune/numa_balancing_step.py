"""The numa-balancing step: kernel.numa_balancing live (and with --persist, at boot) on the host.

Facts and parsers (LiveValue, SysctlFiles, boot_value) live in hwtune/numa.py, FileText in
gpubox/facts.py; this is the pure decision and the plan (a `tee` of the live knob, a Write of gpubox's sysctl.d file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox.context import PERSIST_DEFAULT
from gpubox.facts import FileText
from gpubox.steps import OMIT, Finding, HostPath, Omit, Plan, Run, Step, Write

from .numa import CONF, KNOB, MEANING, LiveValue, SysctlFiles, boot_value, conf_text, desired


@dataclass
class Facts:
    live: int | None
    sysctl_files: list[tuple[str, str]] | None = None  # read only with persist
    own_conf: str | None = None


@dataclass
class Options:
    want: int
    persist: bool = False
    box: str = "BOX"


@dataclass
class Evidence:
    live: int | None
    want: int | Omit = OMIT
    boot: int | None | Omit = OMIT  # the value the sysctl files set at boot
    boot_source: str | None | Omit = OMIT  # the file that sets it


class NumaBalancingStep(Step):
    name = "numa-balancing"
    title = "kernel.numa_balancing"
    where = "host"

    def options(self, ctx) -> Options:
        return Options(desired(ctx), bool(ctx.opt("persist", PERSIST_DEFAULT)), ctx.box.name)

    def gather(self, ctx) -> Facts:
        live = ctx.fact(LiveValue)
        if live is None or not ctx.opt("persist", PERSIST_DEFAULT):
            return Facts(live)
        return Facts(live, ctx.fact(SysctlFiles), ctx.fact(FileText, CONF))

    def decide(self, facts: Facts, opts: Options) -> Finding:
        live, want = facts.live, opts.want
        if live is None:
            return Finding.ok(
                "kernel has no NUMA balancing (no CONFIG_NUMA_BALANCING): nothing to do",
                evidence=Evidence(None),
            )
        problems, ev = [], Evidence(live, want)
        actions: list[Any] = []
        if live != want:
            problems.append(f"kernel.numa_balancing = {live} ({MEANING.get(live, '?')}), want {want}")
            actions.append(Run(["tee", HostPath(KNOB)], input=f"{want}\n", timeout=30))
        if opts.persist:
            boot, src = boot_value(facts.sysctl_files or [])
            ev.boot, ev.boot_source = boot, src
            conf = conf_text(want)
            mine = facts.own_conf == conf
            if boot != want or not mine:
                where = f" from {src}" if src else ""
                later = " (a later sysctl file overrides it: fix that file)" if mine else ""
                problems.append(
                    f"at boot: {boot if boot is not None else 'kernel default'}{where}, "
                    f"want {want} from {CONF}{later}"
                )
            if not mine:
                actions.append(Write(CONF, conf, old=facts.own_conf or ""))
        if not problems:
            return Finding.ok(
                f"kernel.numa_balancing = {live} ({MEANING[live]})"
                + (f"; persisted in {CONF}" if opts.persist else ""),
                evidence=ev,
            )
        desc = [f"write {want} to {KNOB}"] if live != want else []
        if any(isinstance(a, Write) for a in actions):
            desc.append(f"persist in {CONF}")
        return Finding.drift(
            "; ".join(problems),
            cause="default after reboot" if live != want else None,
            repair=f"gpubox tune numa {opts.box}" + (" --persist" if opts.persist else ""),
            plan=Plan(" and ".join(desc), actions=actions),
            evidence=ev,
        )
