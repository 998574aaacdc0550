"""The host-devices step: the NVIDIA majors and device nodes on the Proxmox host, from
provision.devices / provision.gpucheck / provision.hostdiag facts and a pure `decide`
(tests/steps/host-devices/*.json). The repair is `nvidia-modprobe` runs (+ the boot files with
--persist); a plan that loads nvidia-uvm starts with container-config's `ShowConfigFirst`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox import bootbins
from gpubox.context import PERSIST_DEFAULT
from gpubox.steps import OMIT, Finding, Omit, Plan, Run, Step, Write

from .container_config_step import ShowConfigFirst
from .devices import (
    DeviceScan,
    DeviceScanFact,
    describe_rdev,
    host_devices,
)
from .gpucheck import GpuPresence, read_presence, shortfall
from .hostdiag import KernelModules, KernelModulesFact, driver_not_loaded
from .lxc import (
    ConfText,
    FileText,
    gpus_wanted,
    needed_modprobe_runs,
    persist_files,
)
from .nodehints import BOOT_RUNS, devn_paths, required_missing


@dataclass
class HostDevicesFacts:
    devices: DeviceScan
    persist: dict[str, str] | None = None  # current text of each boot-persistence file (--persist)
    presence: GpuPresence | None = None  # driver / PCI bus / recorded bus ids (gpucheck)
    kernel: KernelModules | None = None  # read only when nvidia.ko is not loaded (hostdiag)
    devn: dict[str, bool] | None = None  # NVIDIA paths the CT's devN entries name -> on the host
    missing: list[str] | None = None  # with --persist: programs the boot files run, absent on the host


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
        want = gpus_wanted(ctx)
        return HostDevicesOptions(
            bool(ctx.opt("persist", PERSIST_DEFAULT)), None if want is None else int(want), ctx.box.name
        )

    def gather(self, ctx) -> HostDevicesFacts:
        scan = ctx.fact(DeviceScanFact, gpus_wanted(ctx))
        files = None
        if ctx.opt("persist", PERSIST_DEFAULT):
            # the files as they would be for the box's full GPU count, never for fewer
            files = {
                p: ctx.fact(FileText, p) for p in persist_files(max(scan.gpus, int(gpus_wanted(ctx) or 0)))
            }
        facts = HostDevicesFacts(scan, files, read_presence(ctx))
        if files is not None:  # the boot files as they would be, optional-node runs included
            texts = persist_files(max(scan.gpus, int(gpus_wanted(ctx) or 0)), list(BOOT_RUNS)).values()
            facts.missing = bootbins.missing(ctx.fact, texts)
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
        # an optional node a devN entry requires is created at every boot too (nodehints.BOOT_RUNS)
        want_files = persist_files(hd.gpus, [p for p in facts.devn or {} if p in BOOT_RUNS])
        missing = (
            [p for p, text in want_files.items() if (facts.persist or {}).get(p, "") != text]
            if opts.persist
            else []
        )
        absent = [p for t in want_files.values() for p in bootbins.programs(t) if p in (facts.missing or [])]
        if absent and opts.persist:  # a boot file naming a missing program is never written
            naming = [p for p, t in want_files.items() if set(bootbins.programs(t)) & set(absent)]
            refused = bootbins.refusal(sorted(set(absent)), "the boot file " + ", ".join(naming))
            missing = [p for p in missing if p not in naming]
            if not problems:
                ev.persist_missing = missing
                return Finding.failed(refused[0], cause=refused[1], repair=refused[2], evidence=ev)
            problems.append(refused[0])
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


def steps(ctx=None) -> list:
    """The host-devices step (gpubox.areas.PIPELINE)."""
    return [HostDevicesStep()]
