"""The container step: the running container can open the NVIDIA nodes (the in-container probe;
tests/steps/container/*.json). Its repair is `ContainerRestart` (a start or reboot through pct or
the Proxmox API, asking for consent, then waiting) or live `lxc-cgroup` rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.steps import OMIT, Action, Execution, Finding, Omit, Plan, Run, Step

from .devices import (
    DeviceScan,
    DeviceScanFact,
    HostDevices,
    host_devices,
)
from .lxc import (
    RESTART_POLICIES,
    ConfText,
    ContainerStatus,
    CudaProbe,
    OwnedRecord,
    clear_restart_due,
    gpus_wanted,
    pending_lines,
)
from .lxc import _control as control


@dataclass
class ContainerFacts:
    status: dict[str, Any]  # {'status': ..., 'lock': ...}
    vmid: int
    control: str = "pct"  # pct | api
    devices: DeviceScan | None = None  # read only when the container runs
    probe: dict[str, Any] | None = None  # the in-container probe over the passed nodes
    restart_due: bool = False  # gpubox rewrote the config since it last (re)started it
    pending: list[str] | None = None  # keyed lines of [pve:pending]


@dataclass
class ContainerOptions:
    restart: str = "auto"
    box: str = "BOX"
    start: list[str] = field(default_factory=list)  # what a start runs, as the plan shows it
    reboot: list[str] = field(default_factory=list)  # what a reboot runs


@dataclass
class ContainerEvidence:  # field order = the record's key order
    need: str | Omit = OMIT  # start | live | reboot
    majors: list[int] | Omit = OMIT  # live: the majors to allow
    status: str = ""
    control: str = ""
    lock: str | None = None
    nodes: dict[str, str] | Omit = OMIT  # path -> ok | errno name, from the probe


class ContainerStep(Step):
    """The running container can open the NVIDIA nodes.

    The finding is a pure decision over facts (status, probe). The repair is a `ContainerRestart`
    action (a start or reboot through pct or the Proxmox API, with its consent) or, for the live
    cgroup rules, plain `lxc-cgroup` runs."""

    name = "container"
    title = "GPU nodes usable in the running container"
    where = "host"
    requires = ("container-config",)

    def options(self, ctx) -> ContainerOptions:
        policy = ctx.opt("restart", "auto")
        if policy not in RESTART_POLICIES:
            raise GpuboxError(f"--restart {policy!r} is not known", "use auto, never or always")
        ctl = control(ctx)
        return ContainerOptions(policy, ctx.box.name, ctl.describe("start"), ctl.describe("reboot"))

    def gather(self, ctx) -> ContainerFacts:
        ctl = control(ctx)
        st = ctx.fact(ContainerStatus, ctl)
        facts = ContainerFacts(dict(st), ctl.vmid, ctl.kind)
        if st.get("lock"):
            return facts
        facts.pending = pending_lines(ctx.fact(ConfText, ctl.vmid))
        if st["status"] != "running":
            return facts
        facts.devices = ctx.fact(DeviceScanFact, gpus_wanted(ctx))
        nodes = tuple(n.path for n in host_devices(facts.devices).pass_nodes())
        facts.probe = ctx.fact(CudaProbe, *nodes)
        facts.restart_due = ctx.fact(OwnedRecord, ctl.vmid).restart_due
        return facts

    def decide(self, facts: ContainerFacts, opts: ContainerOptions) -> Finding:
        st, vmid = facts.status, facts.vmid
        ev = ContainerEvidence(status=st["status"], control=facts.control, lock=st.get("lock"))
        if st.get("lock"):
            return Finding.failed(
                f"CT {vmid} is locked ({st['lock']})",
                cause=f"{st['lock']} in progress",
                repair="wait for it to finish, then re-run",
                evidence=ev,
            )
        if st["status"] != "running":
            ev.need = "start"
            return Finding.drift(
                f"CT {vmid} is {st['status']}",
                cause="the container is not running",
                repair=f"gpubox lxc fix {opts.box} (starts it)",
                plan=self._restart_plan("start", facts, opts),
                evidence=ev,
            )
        res = facts.probe or {}
        if res.get("error"):
            return Finding.failed(
                f"in-container probe failed: {res['error']}",
                repair="check that python3 exists in the container",
                evidence=ev,
            )
        bad = {p: s for p, s in res["nodes"].items() if s != "ok"}
        ev.nodes = res["nodes"]
        if not bad:
            if facts.restart_due and opts.restart == "always":
                ev.need = "reboot"
                return Finding.drift(
                    "nodes usable, but the config changed and --restart always",
                    plan=self._restart_plan("reboot", facts, opts),
                    evidence=ev,
                )
            return Finding.ok(f"CT {vmid} running; {len(res['nodes'])} NVIDIA nodes open fine", evidence=ev)
        detail = ", ".join(f"{p}: {s}" for p, s in bad.items())
        if all(s == "EPERM" for s in bad.values()):
            hd = host_devices(facts.devices) if facts.devices else HostDevices({}, 0)
            ev.need = "live"
            ev.majors = sorted({hd.node(p).want[0] for p in bad if hd.node(p) and hd.node(p).want})
            plan = (
                self._restart_plan("reboot", facts, opts)
                if opts.restart == "always"
                else Plan(
                    "live-apply the device rules (lxc-cgroup)",
                    actions=[
                        Run(
                            ["lxc-cgroup", "-n", str(vmid), "devices.allow", f"c {m}:* rwm"],
                            timeout=30,
                            become=True,
                        )
                        for m in ev.majors
                    ],
                )
            )
            return Finding.drift(
                detail,
                cause="the live device cgroup denies them (rule missing/stale at start)",
                repair=f"gpubox lxc fix {opts.box} (live-applies the rules with lxc-cgroup, no restart)",
                plan=plan,
                evidence=ev,
            )
        ev.need = "reboot"
        return Finding.drift(
            detail,
            cause="nodes missing or stale in the container (bound at start)",
            repair=f"gpubox lxc fix {opts.box} (restarts the container so LXC binds the host's current nodes)",
            plan=self._restart_plan("reboot", facts, opts),
            evidence=ev,
        )

    @staticmethod
    def _restart_plan(action: str, facts: ContainerFacts, opts: ContainerOptions) -> Plan:
        note = " (this also applies the pending changes)" if facts.pending else ""
        argv = opts.start if action == "start" else opts.reboot
        restart = ContainerRestart(action, facts.vmid, list(argv), opts.restart)
        return Plan(f"{action} CT {facts.vmid}{note}", [restart])


@dataclass
class ContainerRestart(Action):
    """Start or reboot the container through its control (pct or the Proxmox API), then wait
    until it is running. A reboot interrupts what runs in the container, so it asks first: with
    --restart never it is refused (the record names the command to run when convenient); with
    --restart auto it needs --yes or a yes at the prompt (the `confirm` option), else nothing is
    done. A start (the container is stopped) interrupts nothing and needs no consent.
    `argv` is the control's own describe(action): what a dry run shows is what act() runs."""

    action: str  # start | reboot
    vmid: int
    argv: list[str]
    policy: str = "auto"  # --restart: auto | never | always
    where: str | None = "host"

    def describe(self, host) -> list[list[str]]:
        return [list(self.argv)]

    def consent(self, ctx) -> None:
        """Raise GpuboxError (nothing done) unless this restart may run now."""
        if self.policy == "never":
            raise GpuboxError(
                f"CT {self.vmid} needs a {self.action} to pick up the device changes; not done (--restart never)",
                f"run `{' '.join(self.argv)}` when convenient, or re-run with --restart auto --yes",
            )
        if self.action == "reboot" and self.policy == "auto" and not ctx.opt("yes"):
            confirm = ctx.opt("confirm")
            if not (callable(confirm) and confirm(f"Restart CT {self.vmid} ({ctx.box.name}) now?")):
                raise GpuboxError(
                    f"CT {self.vmid} needs a restart to pick up the device changes; "
                    "not restarted without consent",
                    "re-run with --yes (or answer yes at the prompt)",
                )

    def execute(self, run: Execution) -> None:
        ctx = run.ctx
        self.consent(ctx)
        ctl = control(ctx)
        ctl.act(self.action)
        clear_restart_due(ctx.host.name, ctl.vmid)


def steps(ctx=None) -> list:
    """The container step (gpubox.areas.PIPELINE)."""
    return [ContainerStep()]
