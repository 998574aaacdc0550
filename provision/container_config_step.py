"""The container-config step: the main section of /etc/pve/lxc/<vmid>.conf agrees with the host's
NVIDIA devices (provision.confedit decides the edit; tests/steps/container-config/*.json).

Its repair is `ConfigCommit` (Proxmox's lock + digest re-check + rename() + re-read, not a plain
file write). `ShowConfigFirst` runs first in host-devices' plan when that loads nvidia-uvm: it keeps
this step's finding as a dry run shows it, so the commit after modprobe is proven to be it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.steps import OMIT, Action, Execution, Finding, Omit, Plan, Refuse, Step

from .confedit import MODES, decide
from .devices import (
    UVM_PENDING,
    DeviceScan,
    DeviceScanFact,
    HostDevices,
    host_devices,
    predicted_dynamic_major,
    with_uvm_major,
)
from .lxc import (
    UDEV_RULE,
    ConfText,
    FileText,
    HostRdev,
    OwnedRecord,
    gpus_wanted,
    pending_lines,
    record_majors,
    referenced_paths,
)
from .lxcconf import NO_QUORUM, LxcConf, conf_path, digest, no_quorum, write_conf
from .nodehints import boot_created

# ctx.memo key: container-config's finding as shown before host-devices loaded nvidia-uvm
SHOWN_CONFIG = "container-config/shown-before-modprobe"


@dataclass
class ConfigFacts:
    conf: str  # /etc/pve/lxc/<vmid>.conf, as read
    devices: DeviceScan
    rdev: dict[str, tuple[str, int, int] | None] = field(default_factory=dict)  # referenced_paths
    recorded: list[int] = field(default_factory=list)  # majors gpubox recorded as NVIDIA's
    boot_rule: str = ""  # the udev rule gpubox persists: which optional nodes every boot creates
    read_only: bool = False  # the file shows as pmxcfs shows it without quorum (lxcconf.no_quorum)
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
    no quorum refused before anything is written, Proxmox's lock file, a digest re-check under it,
    a symlink refusal and a rename() re-read afterwards (provision.lxcconf.write_conf; pmxcfs has
    no RENAME_EXCHANGE), which a plain `Write` (tmp + rename, no lock, no re-check) would lose; it
    also records the NVIDIA majors as gpubox's. A dry run shows its diff; it runs no command."""

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

    `decide` is provision.confedit.decide over facts; the repair is a `ConfigCommit` action."""

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
        scan = ctx.fact(DeviceScanFact, gpus_wanted(ctx))
        rdev = ctx.fact(HostRdev, tuple(referenced_paths(text, host_devices(scan))))
        return ConfigFacts(
            text,
            scan,
            rdev,
            ctx.fact(OwnedRecord, vmid).majors,
            shown=shown,
            boot_rule=ctx.fact(FileText, UDEV_RULE),
            read_only=no_quorum(ctx.host.stat(conf_path(vmid))),
        )

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
        hd.at_boot = boot_created(facts.boot_rule)
        rev, predicted = self._decide_edit(conf, hd, facts, opts)
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
        if rev.changed and facts.read_only:
            # pmxcfs without quorum refuses every write (EACCES): said now, in doctor and dry runs
            # too, not first met by the commit (which refuses it as well, before any backup)
            return Finding.failed(
                f"{'; '.join(i.text for i in rev.issues)}{note}; {NO_QUORUM}",
                cause="this node has no quorum: pmxcfs refuses every write to /etc/pve (EACCES)",
                repair=f"bring the cluster back to quorum (pvecm status), then gpubox lxc fix {opts.box}",
                evidence=ev,
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
    def _decide_edit(conf, hd: HostDevices, facts: ConfigFacts, opts: ConfigOptions):
        """(review, predicted uvm major or None). When nvidia-uvm is not loaded yet (host-devices,
        which this step requires, loads it) its major is unknown until then: the review is made
        with a stand-in major (the kernel's prediction, one the config does not mention), and
        the stand-in is then written as UVM_PENDING in the text, so a dry run shows
        `c <nvidia-uvm major, read after modprobe>:* rwm` where apply writes the major it reads."""
        recorded = set(facts.recorded)
        if hd.uvm is not None or hd.frontend is None:
            return decide(conf, hd, opts.mode, _lookup(facts.rdev), recorded, _exists(facts.rdev)), None
        taken = set(hd.char_majors) | set(hd.majors.values()) | recorded
        predicted = predicted_dynamic_major(taken)
        stand = predicted
        while stand is not None and (str(stand) in facts.conf or stand in taken):
            taken.add(stand)
            stand = predicted_dynamic_major(taken)
        if stand is None:  # every dynamic major taken: nvidia-modprobe will fail, host-devices says so
            return decide(conf, hd, opts.mode, _lookup(facts.rdev), recorded, _exists(facts.rdev)), None
        rev = decide(
            conf, with_uvm_major(hd, stand), opts.mode, _lookup(facts.rdev), recorded, _exists(facts.rdev)
        )
        rule = f"c {stand}:"
        rev.new = rev.new.replace(rule, f"c {UVM_PENDING}:")
        for i in rev.issues:
            i.text = i.text.replace(f"nvidia-uvm is now {stand}", "nvidia-uvm is not loaded yet")
            i.text = re.sub(rf"\b{stand}\b", UVM_PENDING, i.text)
        return rev, predicted


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


def steps(ctx=None) -> list:
    """The container-config step (gpubox.areas.PIPELINE)."""
    return [ContainerConfigStep()]
