"""The pcie-mrrs step: a pure decision over the facts of hwtune/pcie.py.

It plans one masked setpci write per function whose MaxReadReq is off target; the write's
read-back (only bits 14:12 may have moved, docs/facts.md "PCIe Device Control") is the `after=` check of
its Run action, so it reads and never writes. With --persist the boot unit is a Write plus
`systemctl daemon-reload` / `enable` Run actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpubox import bootbins
from gpubox.context import PERSIST_DEFAULT
from gpubox.steps import OMIT, Finding, Omit, Plan, Run, Step, Write

from .pcie import (
    LOCKDOWN,
    MRRS_MASK,
    UNIT,
    UNIT_PATH,
    UNREADABLE_FIX,
    DeviceRegs,
    Lockdown,
    UnitEnabled,
    UnitFile,
    check_write,
    decode_devctl,
    gather_devices,
    masked_write,
    mrrs_bytes,
    parse_mrrs,
    unit_bdfs,
    unit_text,
)


def _target(ctx) -> int:
    v = ctx.opt("mrrs")
    if v is None:
        v = ctx.box.var("gpubox_pcie_mrrs", 4096)
    return parse_mrrs(v)


@dataclass
class MrrsFacts:
    devices: list[DeviceRegs] = field(default_factory=list)
    lockdown: str | None = None  # kernel lockdown mode, None when off
    unit: str | None = None  # with persist: the boot unit's text ("" = missing)
    unit_enabled: str | None = None  # with persist and a unit file: `systemctl is-enabled`
    missing: list[str] = field(default_factory=list)  # with persist: programs the unit runs, absent


@dataclass
class MrrsOptions:
    code: int = 5  # MaxReadReq code (128 << code bytes)
    persist: bool = False
    box: str = "BOX"
    expect_gpus: int | None = None  # gpubox_gpus: the unit is never rewritten for fewer


@dataclass
class MrrsEvidence:
    """The record: `lockdown` (refused by kernel lockdown) or `refused` (drift: functions left
    alone) first, as the record always had them, then the target and every function."""

    lockdown: str | Omit = OMIT  # the kernel lockdown mode that refused the writes
    refused: list[str] | Omit = OMIT  # bus ids left alone
    target: int = 0
    devices: list[dict[str, Any]] = field(default_factory=list)


class PcieMrrsStep(Step):
    name = "pcie-mrrs"
    title = "PCIe MaxReadReq on GPU functions"
    where = "host"

    def options(self, ctx) -> MrrsOptions:
        want = ctx.box.var("gpubox_gpus", None)
        return MrrsOptions(
            _target(ctx),
            bool(ctx.opt("persist", PERSIST_DEFAULT)),
            ctx.box.name,
            None if want is None else int(want),
        )

    def gather(self, ctx) -> MrrsFacts:
        facts = MrrsFacts(gather_devices(ctx))
        if not facts.devices:
            return facts
        facts.lockdown = ctx.fact(Lockdown)
        if ctx.opt("persist", PERSIST_DEFAULT):
            facts.unit = ctx.fact(UnitFile)
            if facts.unit:
                facts.unit_enabled = ctx.fact(UnitEnabled)
            funcs = [(d.bdf, d.ident) for d in facts.devices if d.devctl is not None]
            facts.missing = bootbins.missing(ctx.fact, [unit_text(funcs, self.options(ctx).code)])
        return facts

    def decide(self, facts: MrrsFacts, opts: MrrsOptions) -> Finding:
        code, want = opts.code, mrrs_bytes(opts.code)
        states = [d.state() for d in facts.devices]
        devices = [s.to_dict() for s in states]
        if not states:
            return Finding.ok("no NVIDIA GPU functions found in sysfs", evidence=MrrsEvidence(target=want))

        def ev(**kw) -> MrrsEvidence:
            return MrrsEvidence(target=want, devices=devices, **kw)

        refused = [s for s in states if s.error]
        broken = [s for s in states if s.unreadable]
        if broken:  # refuse every write on this host: a bus problem is not ours to tune around
            return Finding.failed(
                "; ".join(s.error for s in broken),
                cause="config space does not read back sanely",
                repair=UNREADABLE_FIX,
                evidence=ev(),
            )
        todo = [s for s in states if s.devctl is not None and (s.devctl & MRRS_MASK) >> 12 != code]
        problems = []
        if todo:
            problems.append(
                ", ".join(f"{s.bdf} MaxReadReq {decode_devctl(s.devctl)['mrrs']}" for s in todo)
                + f" (want {want})"
            )
        unit_problem, unit = None, None
        lost = _lost_gpus(facts, states, opts)
        if lost:
            return Finding.failed(
                lost,
                cause="a GPU is missing from the PCI bus (fell off the bus / not detected at boot)",
                repair="fix the GPU first (kernel log: Xid 79; reseat, power); the boot unit is not "
                "rewritten for fewer GPUs",
                evidence=ev(),
            )
        if opts.persist:
            unit = unit_text([(d.bdf, d.ident) for d in facts.devices if d.devctl is not None], code)
            missing = [p for p in bootbins.programs(unit) if p in facts.missing]
            if missing:  # never install a unit that fails at every boot; the live writes still go
                detail, cause, repair = bootbins.refusal(missing, f"the boot unit {UNIT}")
                if not todo:
                    return Finding.failed(
                        "; ".join(problems + [detail]), cause=cause, repair=repair, evidence=ev()
                    )
                problems.append(detail)
                unit = None
            unit_problem = _unit_problem(facts, unit) if unit is not None else None
            if unit_problem:
                problems.append(unit_problem)
        if todo or unit_problem:
            mode = facts.lockdown if todo else None
            if mode:
                return Finding.failed(
                    f"{'; '.join(problems)}; kernel lockdown ({mode}) refuses PCI config writes",
                    cause=f"{LOCKDOWN} says [{mode}]: userspace config-space writes are blocked",
                    repair="boot without lockdown (disable Secure Boot lockdown / lockdown= on the "
                    "kernel command line), then re-run",
                    evidence=ev(lockdown=mode),
                )
            repair = f"gpubox tune pcie {opts.box}" + (" --persist" if unit_problem else "")
            return Finding.drift(
                "; ".join(problems),
                cause="firmware default after reboot" if todo else None,
                repair=repair,
                plan=_plan(todo, code, unit if unit_problem else None, facts.unit or ""),
                evidence=ev(refused=[s.bdf for s in refused]),
            )
        if refused:
            return Finding.failed(
                "; ".join(s.error for s in refused),
                cause="a GPU-class function without a PCI Express capability",
                repair="check the device (passthrough quirk, wrong driver); it is left alone",
                evidence=ev(),
            )
        ok = [s for s in states if s.devctl is not None]
        return Finding.ok(
            f"{len(ok)} function(s) at MaxReadReq {want}" + (" (boot unit enabled)" if opts.persist else ""),
            evidence=ev(),
        )


def _lost_gpus(facts: MrrsFacts, states, opts: MrrsOptions) -> str | None:
    """Why the unit must stay as it is: it names GPUs that are gone, or fewer GPUs than expected."""
    if not opts.persist:
        return None
    gpus = {s.bdf for s in states if s.devctl is not None}
    gone = [b for b in unit_bdfs(facts.unit or "") if b not in gpus]
    if gone:
        return (
            f"{len(gpus)} of {len(gpus) + len(gone)} GPUs: the boot unit names {', '.join(gone)}, "
            "no longer on the PCI bus"
        )
    if opts.expect_gpus and len(gpus) < opts.expect_gpus:
        return f"{len(gpus)} of {opts.expect_gpus} GPUs on the PCI bus: not writing a boot unit for fewer"
    return None


def _unit_problem(facts: MrrsFacts, want: str) -> str | None:
    if facts.unit != want:
        return "boot unit missing" if not facts.unit else "boot unit differs"
    if facts.unit_enabled != "enabled":
        return "boot unit not enabled"
    return None


def _plan(todo, code: int, unit: str | None, old_unit: str) -> Plan:
    """One masked write per function (read back by its `after` check), then the boot unit."""
    actions: list[Any] = []
    texts = []
    for s in todo:
        before = s.devctl
        after = (before & ~MRRS_MASK) | (code << 12)
        actions.append(
            Run(masked_write(s.bdf, code), timeout=30, after=partial(check_write, s.bdf, before, code))
        )
        texts.append(
            f"{s.bdf}: DevCtl 0x{before:04x} -> 0x{after:04x} "
            f"(MaxReadReq {decode_devctl(before)['mrrs']} -> {mrrs_bytes(code)}, "
            f"MaxPayload {decode_devctl(before)['mps']} unchanged)"
        )
    desc = "; ".join(texts)
    if unit is not None:
        actions += [
            Write(UNIT_PATH, unit, old=old_unit, mode=0o644),
            Run(["systemctl", "daemon-reload"], timeout=60),
            Run(["systemctl", "enable", UNIT], timeout=60),
        ]
        desc = (desc + "; " if desc else "") + f"install and enable {UNIT}"
    return Plan(desc, actions=actions)
