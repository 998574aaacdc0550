"""The LXC GPU-access steps (host-devices, container-config, container, cuda): facts from
provision.lxc / provision.devices, a pure `decide` each (tests/steps/<step>/*.json).

Every change is an action of the plan (gpubox.steps.Action), the engine runs them: besides the
plain `Run`/`Write`, `ConfigCommit` (the config commit is Proxmox's lock + digest re-check +
renameat2 exchange, not a plain file write), `ContainerRestart` (a start or reboot asks for
consent and waits for the container) and `ShowConfigFirst` (before nvidia-uvm is loaded: keeps
container-config's finding as a dry run shows it, so the commit after modprobe is proven to be it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpubox.context import PERSIST_DEFAULT
from gpubox.errors import GpuboxError
from gpubox.steps import OMIT, Action, Execution, Finding, Omit, Plan, Refuse, Run, Step, Write

from . import cuda_probe
from .confedit import MODES, review
from .devices import (
    UVM_PENDING,
    DeviceScan,
    DeviceScanFact,
    HostDevices,
    describe_rdev,
    host_devices,
    predicted_dynamic_major,
    with_uvm_major,
)
from .gpucheck import GpuPresence, read_presence, shortfall
from .hostdiag import KernelModules, KernelModulesFact, driver_not_loaded
from .lxc import (
    RESTART_POLICIES,
    ConfText,
    ContainerStatus,
    CudaProbe,
    FileText,
    HostRdev,
    OwnedRecord,
    clear_restart_due,
    needed_modprobe_runs,
    pending_lines,
    persist_files,
    record_majors,
    referenced_paths,
)
from .lxc import _control as control
from .lxcconf import LxcConf, conf_path, digest, write_conf
from .nodehints import devn_paths, required_missing


def _gpus(ctx):
    return ctx.box.var("gpubox_gpus")


# --- host-devices -------------------------------------------------------------------------------

# ctx.memo key: container-config's finding as shown before host-devices loaded nvidia-uvm
SHOWN_CONFIG = "container-config/shown-before-modprobe"


@dataclass
class HostDevicesFacts:
    devices: DeviceScan
    persist: dict[str, str] | None = None  # current text of each boot-persistence file (--persist)
    presence: GpuPresence | None = None  # driver / PCI bus / recorded bus ids (gpucheck)
    kernel: KernelModules | None = None  # read only when nvidia.ko is not loaded (hostdiag)
    devn: dict[str, bool] | None = None  # NVIDIA paths the CT's devN entries name -> on the host


@dataclass
class HostDevicesOptions:
    persist: bool = False
    expect_gpus: int | None = None  # gpubox_gpus from the inventory
    box: str = "BOX"


@dataclass
class HostDevicesEvidence:
    majors: dict[str, int]
    gpus: int
    nodes: dict[str, str]
    persist_missing: list[str] | Omit = OMIT
    expected: int | Omit = OMIT  # gpubox_gpus, when the count falls short
    missing_gpus: dict[str, str] | Omit = OMIT  # bus id -> where it is missing
    kernel: dict[str, Any] | Omit = (
        OMIT  # running kernel and its NVIDIA modules, when nvidia.ko is not loaded
    )


class HostDevicesStep(Step):
    """NVIDIA majors and nodes on the host; the repair is nvidia-modprobe runs (+ boot files)."""

    name = "host-devices"
    title = "NVIDIA device nodes on the Proxmox host"
    where = "host"

    def options(self, ctx) -> HostDevicesOptions:
        want = _gpus(ctx)
        return HostDevicesOptions(
            bool(ctx.opt("persist", PERSIST_DEFAULT)), None if want is None else int(want), ctx.box.name
        )

    def gather(self, ctx) -> HostDevicesFacts:
        scan = ctx.fact(DeviceScanFact, _gpus(ctx))
        files = None
        if ctx.opt("persist", PERSIST_DEFAULT):
            # the files as they would be for the box's full GPU count, never for fewer
            files = {p: ctx.fact(FileText, p) for p in persist_files(max(scan.gpus, int(_gpus(ctx) or 0)))}
        facts = HostDevicesFacts(scan, files, read_presence(ctx))
        if host_devices(scan).frontend is None:
            facts.kernel = ctx.fact(KernelModulesFact)
        vmid = getattr(ctx.box, "vmid", None)
        if vmid and ctx.host.exists(f"/etc/pve/lxc/{vmid}.conf"):
            facts.devn = {p: ctx.host.exists(p) for p in devn_paths(ctx.fact(ConfText, vmid))}
        return facts

    def decide(self, facts: HostDevicesFacts, opts: HostDevicesOptions) -> Finding:
        hd = host_devices(facts.devices)
        ev = HostDevicesEvidence(
            hd.nvidia_majors(), hd.gpus, {n.path: describe_rdev(n.have) for n in hd.nodes}
        )
        if hd.frontend is None:
            detail, cause, repair, kernel = driver_not_loaded(facts.kernel)
            if kernel is not None:
                ev.kernel = kernel
            return Finding.failed(detail, cause=cause, repair=repair, evidence=ev)
        short = shortfall(facts.presence, opts.expect_gpus) if facts.presence else None
        if short is not None:  # a lost GPU is a failure, never a smaller box to persist
            ev.expected, ev.missing_gpus = short.want, short.missing
            return Finding.failed(short.detail, cause=short.cause, repair=short.repair, evidence=ev)
        problems = []
        if hd.uvm is None:
            problems.append("nvidia-uvm is not loaded (no nvidia-uvm line in /proc/devices)")
        for n in hd.nodes:
            if not n.required or n.ok:
                continue
            if not n.present:
                problems.append(f"{n.path} missing")
            elif n.want is not None:
                problems.append(f"{n.path} is {describe_rdev(n.have)}, want {describe_rdev(n.want)}")
        flagged = {p.split(" ", 1)[0] for p in problems}
        devn_runs = []
        for path, run in required_missing(
            list(facts.devn or {}), {p for p, ok in (facts.devn or {}).items() if ok}
        ):
            if path in flagged:
                continue
            problems.append(f"{path} missing: a devN entry of the container requires it (the start fails)")
            if run:
                devn_runs.append(run)
        want_files = persist_files(hd.gpus)
        missing = (
            [p for p, text in want_files.items() if (facts.persist or {}).get(p, "") != text]
            if opts.persist
            else []
        )
        ev.persist_missing = missing
        if not (problems or missing):
            return Finding.ok(
                f"nvidia {hd.frontend}, nvidia-uvm {hd.uvm}; {hd.gpus} GPU nodes and "
                f"/dev/nvidia-uvm{{,-tools}} {hd.uvm}:0/1 present",
                evidence=ev,
            )
        runs = needed_modprobe_runs(hd)
        runs += [r for r in devn_runs if r not in runs]
        actions: list[Any] = [ShowConfigFirst()] if any("-u" in argv for argv in runs) else []
        actions += [Run(argv, timeout=60, become=True) for argv in runs]
        actions += [Write(p, want_files[p], old=(facts.persist or {}).get(p, "")) for p in missing]
        what = (["create the nodes with nvidia-modprobe"] if runs else []) + (
            [f"write {', '.join(missing)}"] if missing else []
        )
        detail = "; ".join(problems + [f"boot persistence missing: {p}" for p in missing])
        return Finding.drift(
            detail,
            cause=(
                "a node the container's devN entries require is not created at boot (recent drivers "
                "no longer create /dev/nvidia-modeset; nvidia-modprobe -m does)"
                if devn_runs and len(problems) == len(devn_runs)
                else "nvidia-uvm nodes absent or stale on the host"
            )
            if problems
            else "nothing creates the uvm nodes at boot",
            repair=f"gpubox lxc fix {opts.box}"
            + (f" (runs {'; '.join(' '.join(a) for a in runs)})" if runs else "")
            + (
                ""
                if opts.persist or not problems
                else f"; boot files too: gpubox lxc fix {opts.box} --persist"
            ),
            plan=Plan(" and ".join(what), actions=actions),
            evidence=ev,
        )


@dataclass
class ShowConfigFirst(Action):
    """Runs first in a plan that loads nvidia-uvm: keeps container-config's finding as a dry run
    shows it now (its uvm rule at the major read after modprobe), so container-config then checks
    that what it writes is that plan with the major filled in (ContainerConfigStep.decide). It
    changes nothing on the box and shows nothing; a config container-config cannot read is its
    own to report."""

    def execute(self, run: Execution) -> None:
        memo = getattr(run.ctx, "memo", None)
        if memo is None:
            return
        try:
            memo[SHOWN_CONFIG] = ContainerConfigStep().check(run.ctx)
        except GpuboxError:
            memo.pop(SHOWN_CONFIG, None)  # container-config reports that itself


# --- container-config ---------------------------------------------------------------------------


@dataclass
class ConfigFacts:
    conf: str  # /etc/pve/lxc/<vmid>.conf, as read
    devices: DeviceScan
    rdev: dict[str, tuple[str, int, int] | None] = field(default_factory=dict)  # referenced_paths
    recorded: list[int] = field(default_factory=list)  # majors gpubox recorded as NVIDIA's
    # in a run where host-devices has just loaded nvidia-uvm: the config text the dry run showed
    # before (ShowConfigFirst), or None when that plan wrote nothing
    shown: "ShownConfig | None" = None


@dataclass
class ShownConfig:
    text: str | None  # the text container-config would have committed, UVM_PENDING in it


@dataclass
class ConfigOptions:
    vmid: int
    mode: str | None = None  # gpubox_device_mode; None: follow how the config passes nodes
    box: str = "BOX"


@dataclass
class ConfigEvidence:
    path: str
    digest: str
    mode: str
    snapshots: list[str]
    pending: list[str] | Omit = OMIT
    issues: list[dict[str, str]] | Omit = OMIT
    warnings: list[str] | Omit = OMIT


def _lookup(rdev: dict[str, Any]):
    """host_rdev over the stat()s gathered; a path the facts lack is a bug in referenced_paths."""

    def get(path: str):
        if path not in rdev:
            raise KeyError(f"host path {path} was not gathered (provision.lxc.referenced_paths)")
        v = rdev[path]
        return None if v is None or isinstance(v, str) else tuple(v)

    return get


def _exists(rdev: dict[str, Any]):
    """host_exists over the same facts: a device node, a plain file or a directory."""

    def exists(path: str) -> bool:
        return rdev.get(path) is not None

    exists.is_dir = lambda path: rdev.get(path) == "dir"  # type: ignore[attr-defined]
    return exists


@dataclass
class ConfigCommit(Action):
    """The container config's new main section, committed against the digest it was read at:
    Proxmox's lock file, a digest re-check under it, a symlink refusal and a
    renameat2(RENAME_EXCHANGE) commit re-checked afterwards (provision.lxcconf.write_conf), which
    a plain `Write` (tmp + rename, no lock, no re-check) would lose; it also records the NVIDIA
    majors as gpubox's. A dry run shows its diff; it runs no command."""

    vmid: int
    text: str
    digest: str
    majors: list[int]
    shown_diff: str = ""  # review's diff of the main section (what a dry run shows)
    where: str | None = "host"

    def diff(self) -> str:
        return self.shown_diff

    def execute(self, run: Execution) -> None:
        if UVM_PENDING in self.text:
            raise GpuboxError(
                "the nvidia-uvm major is not known yet: nvidia-uvm is not loaded on the host",
                "run host-devices first (do not --skip it): it loads the module, then its major is read",
            )
        host = run.host(self.where)
        write_conf(host, self.vmid, self.text, self.digest)
        record_majors(host.name, self.vmid, self.majors, restart_due=digest(self.text))


def config_commit(plan: Plan | None) -> ConfigCommit | None:
    """The plan's config commit, if it has one."""
    for a in plan.actions if plan is not None else []:
        if isinstance(a, ConfigCommit):
            return a
    return None


class ContainerConfigStep(Step):
    """The main section of the container config agrees with the host's NVIDIA devices.

    `decide` is provision.confedit.review over facts; the repair is a `ConfigCommit` action."""

    name = "container-config"
    title = "GPU devices in the container config"
    where = "host"
    requires = ("host-devices",)

    def options(self, ctx) -> ConfigOptions:
        var = ctx.box.var("gpubox_device_mode", None)
        if var is not None and str(var) not in MODES:
            raise GpuboxError(
                f"{ctx.box.name}: gpubox_device_mode {var!r} is not known", "use cgroup2 or devN"
            )
        return ConfigOptions(ctx.box.vmid, None if var is None else str(var), ctx.box.name)

    def gather(self, ctx) -> ConfigFacts:
        memo = getattr(ctx, "memo", None)
        before = memo.pop(SHOWN_CONFIG, None) if memo is not None else None
        commit = config_commit(before.plan) if before is not None else None
        shown = None if before is None else ShownConfig(commit.text if commit is not None else None)
        vmid = ctx.box.vmid
        text = ctx.fact(ConfText, vmid)
        if LxcConf.parse(text).lock:
            return ConfigFacts(text, DeviceScan("", 0))  # not edited: nothing else is needed
        scan = ctx.fact(DeviceScanFact, _gpus(ctx))
        rdev = ctx.fact(HostRdev, tuple(referenced_paths(text, host_devices(scan))))
        return ConfigFacts(text, scan, rdev, ctx.fact(OwnedRecord, vmid).majors, shown)

    def decide(self, facts: ConfigFacts, opts: ConfigOptions) -> Finding:
        """The review's finding; in a run where host-devices has just loaded nvidia-uvm, also the
        proof that this is the plan a dry run showed: the text it would write must be the shown
        one with the placeholder replaced by the major now read, and nothing else."""
        f = self._decide(facts, opts)
        commit = config_commit(f.plan)
        if facts.shown is None or commit is None:
            return f
        want = facts.shown.text
        uvm = host_devices(facts.devices).uvm
        if want is not None and uvm is not None:
            want = want.replace(UVM_PENDING, str(uvm))
        if want != commit.text:
            return Finding.failed(
                "the config rewrite after nvidia-modprobe is not the one the plan showed before it "
                "(nothing written)",
                cause="the host changed between plan and apply (another driver load, an edit)",
                repair=f"gpubox recover {opts.box} --dry-run, review, then re-run",
                evidence=f.evidence,
            )
        f.detail += f" (nvidia-uvm major read after modprobe: {uvm}, as planned)"
        return f

    def _decide(self, facts: ConfigFacts, opts: ConfigOptions) -> Finding:
        conf = LxcConf.parse(facts.conf)
        path = conf_path(opts.vmid)
        dig = digest(facts.conf)
        ev = ConfigEvidence(path, dig, opts.mode or "follow", conf.snapshots)
        pending = pending_lines(facts.conf)
        if pending is not None:
            ev.pending = pending
        if conf.lock:
            return Finding.failed(
                f"{path} is locked ({conf.lock}): not editing it",
                cause=f"a {conf.lock} is in progress on CT {opts.vmid}",
                repair="wait for it to finish and re-run; `pct unlock "
                f"{opts.vmid}` only if no {conf.lock} runs",
                evidence=ev,
            )
        hd = host_devices(facts.devices)
        rev, predicted = self._review(conf, hd, facts, opts)
        ev.issues = [{"kind": i.kind, "text": i.text} for i in rev.issues]
        ev.warnings = rev.warnings
        note = ""
        if pending:
            note = f" (pending, applied at the next restart: {', '.join(pending)})"
        if predicted is not None:
            note += (
                f" (nvidia-uvm is loaded by host-devices first: its rule is written with the major "
                f"read then, predicted {predicted})"
            )
        refused = [i for i in rev.issues if not i.fixable and i.kind != "devN-node-missing"]
        if refused and rev.changed:
            # a foreign line stops the start: gpubox's own lines are still brought right now (no
            # restart: the container step is blocked), so the box is ready once the operator fixes theirs
            commit = ConfigCommit(
                opts.vmid, rev.new, dig, sorted(hd.nvidia_majors().values()), rev.diff(path)
            )
            return Finding.drift(
                "; ".join(i.text for i in rev.issues) + note,
                cause="a line gpubox does not own stops the container from starting; gpubox's NVIDIA "
                "lines are wrong too",
                repair=f"gpubox lxc fix {opts.box} (rewrites the NVIDIA lines only), then edit {path} "
                "by hand as said",
                plan=Plan(f"rewrite the NVIDIA lines of the main section of {path}", [commit]),
                evidence=ev,
            )
        if refused:
            return Finding.failed(
                "; ".join(i.text for i in refused) + note,
                cause="a line gpubox does not own stops the container from starting",
                repair=f"edit {path} by hand as said, then re-run",
                evidence=ev,
            )
        if rev.issues:
            stale = [i for i in rev.issues if i.kind == "stale-rule"]
            # nothing the file can fix (a devN node missing on the host): apply refuses, saying so
            plan = Plan(
                actions=[
                    Refuse(
                        "the config issues cannot be fixed in the file",
                        "fix host-devices first (the nodes devN names must exist on the host)",
                    )
                ]
            )
            if rev.changed:
                commit = ConfigCommit(
                    opts.vmid, rev.new, dig, sorted(hd.nvidia_majors().values()), rev.diff(path)
                )
                plan = Plan(f"rewrite the main section of {path}", [commit])
            return Finding.drift(
                "; ".join(i.text for i in rev.issues) + note,
                cause="stale nvidia-uvm major in the cgroup rule"
                if stale
                else "the main section does not match the host's NVIDIA devices",
                repair=f"gpubox lxc fix {opts.box} (rewrites the main section only)",
                plan=plan,
                evidence=ev,
            )
        extra = f"; warnings: {'; '.join(rev.warnings)}" if rev.warnings else ""
        how = opts.mode or "as configured"
        return Finding.ok(f"{path} main section matches the host ({how}){note}{extra}", evidence=ev)

    @staticmethod
    def _review(conf, hd: HostDevices, facts: ConfigFacts, opts: ConfigOptions):
        """(review, predicted uvm major or None). When nvidia-uvm is not loaded yet (host-devices,
        which this step requires, loads it) its major is unknown until then: the review is made
        with a stand-in major (the kernel's prediction, one the config does not mention), and
        the stand-in is then written as UVM_PENDING in the text, so a dry run shows
        `c <nvidia-uvm major, read after modprobe>:* rwm` where apply writes the major it reads."""
        recorded = set(facts.recorded)
        if hd.uvm is not None or hd.frontend is None:
            return review(conf, hd, opts.mode, _lookup(facts.rdev), recorded, _exists(facts.rdev)), None
        taken = set(hd.char_majors) | set(hd.majors.values()) | recorded
        predicted = predicted_dynamic_major(taken)
        stand = predicted
        while stand is not None and (str(stand) in facts.conf or stand in taken):
            taken.add(stand)
            stand = predicted_dynamic_major(taken)
        if stand is None:  # every dynamic major taken: nvidia-modprobe will fail, host-devices says so
            return review(conf, hd, opts.mode, _lookup(facts.rdev), recorded, _exists(facts.rdev)), None
        rev = review(
            conf, with_uvm_major(hd, stand), opts.mode, _lookup(facts.rdev), recorded, _exists(facts.rdev)
        )
        rule = f"c {stand}:"
        rev.new = rev.new.replace(rule, f"c {UVM_PENDING}:")
        for i in rev.issues:
            i.text = i.text.replace(f"nvidia-uvm is now {stand}", "nvidia-uvm is not loaded yet")
            i.text = re.sub(rf"\b{stand}\b", UVM_PENDING, i.text)
        return rev, predicted


# --- container ----------------------------------------------------------------------------------


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
        facts.devices = ctx.fact(DeviceScanFact, _gpus(ctx))
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


# --- cuda ---------------------------------------------------------------------------------------


@dataclass
class CudaFacts:
    status: str  # the container's status
    probe: dict[str, Any] | None = None  # the in-container probe (only when running)


@dataclass
class CudaOptions:
    vmid: int = 0
    box: str = "BOX"
    expect_gpus: int | None = None  # gpubox_gpus from the inventory


@dataclass
class CudaEvidence:
    # the in-container probe's answer (provision/cuda_probe), None where it reported nothing
    nodes: dict[str, str] | None | Omit = OMIT  # path -> ok | errno name
    cuinit: int | None | Omit = OMIT  # cuInit's CUresult
    cuinit_name: str | None | Omit = OMIT
    nvml: dict[str, Any] | None | Omit = OMIT  # NVML's answer (count, driver, error)
    kernel_driver: str | None | Omit = OMIT
    user_driver: str | None | Omit = OMIT
    simulated: bool | None | Omit = OMIT
    error: str | None | Omit = OMIT
    causes: list[dict[str, str]] | Omit = OMIT  # {code, cause, repair} per diagnosed cause


_PROBE_KEYS = ("nodes", "cuinit", "cuinit_name", "nvml", "kernel_driver", "user_driver", "simulated", "error")


class CudaStep(Step):
    """CUDA works in the container: the probe's output (a fact) through cuda_probe.diagnose."""

    name = "cuda"
    title = "CUDA inside the container"
    where = "container"
    requires = ("container",)

    def options(self, ctx) -> CudaOptions:
        want = _gpus(ctx)
        return CudaOptions(ctx.box.vmid, ctx.box.name, None if want is None else int(want))

    def gather(self, ctx) -> CudaFacts:
        st = ctx.fact(ContainerStatus, control(ctx))
        if st["status"] != "running":
            return CudaFacts(st["status"])
        return CudaFacts(st["status"], ctx.fact(CudaProbe))

    def decide(self, facts: CudaFacts, opts: CudaOptions) -> Finding:
        if facts.status != "running":
            return Finding.failed(
                f"cannot probe CUDA: CT {opts.vmid} is {facts.status}",
                cause="the container is not running",
                repair=f"gpubox lxc fix {opts.box} (starts it)",
                evidence=CudaEvidence(),
            )
        res = facts.probe or {}
        ev = CudaEvidence(**{k: res.get(k) for k in _PROBE_KEYS})
        found = cuda_probe.diagnose(res, opts.box)
        if found:
            ev.causes = [{"code": c, "cause": why, "repair": fix} for c, why, fix in found]
            return Finding.failed(
                "; ".join(why for _, why, _ in found), cause=found[0][1], repair=found[0][2], evidence=ev
            )
        nv = (res.get("nvml") or {}).get("count")
        if opts.expect_gpus and isinstance(nv, int) and nv < opts.expect_gpus:
            return Finding.failed(
                f"NVML sees {nv} of {opts.expect_gpus} GPUs in the container",
                cause="a GPU is missing: lost on the host (see host-devices) or not passed to the container",
                repair="run gpubox doctor on the host side first; it names the missing bus id",
                evidence=ev,
            )
        return Finding.ok(
            f"cuInit(0) = 0; NVML sees {nv} GPUs; driver {res.get('kernel_driver')} "
            f"(host) = {res.get('user_driver')} (container)",
            evidence=ev,
        )


def steps(ctx=None) -> list:
    """The LXC GPU-access steps in dependency order (also used by `gpubox recover`/`doctor`)."""
    return [HostDevicesStep(), ContainerConfigStep(), ContainerStep(), CudaStep()]
