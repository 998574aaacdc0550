"""Steps that give the LXC container working GPU access after a host reboot, in dependency order:

  host-devices      NVIDIA majors and nodes on the Proxmox host (nvidia-modprobe -c0..-cN-1 -c255, then -u -c0; --persist:
                    modules-load.d + udev rule so the next boot creates them)
  container-config  the main section of /etc/pve/lxc/<vmid>.conf agrees with the host's majors
                    and nodes (safe write: lock, digest, tmp + rename, backup)
  container         the running container sees the nodes: live-apply cgroup rules with lxc-cgroup
                    where that suffices, else (re)start per --restart auto|never|always
  cuda              the in-container probe: open() errno, cuInit, NVML, driver versions

Options read from ctx.options (the CLI and the recover pipeline pass them): dry_run, yes,
restart ("auto" | "never" | "always"), persist, confirm (callable(question) -> bool, optional).
"""

from __future__ import annotations

import os

from gpubox.diffs import unified
from gpubox.errors import GpuboxError
from gpubox.steps import Finding, Plan, Step

from . import cuda_probe
from .confedit import review
from .devices import HostDevices, describe_rdev, read_host_devices
from .lxcconf import conf_path, read_conf, write_conf
from .pve import control_for

MODULES_LOAD = "/etc/modules-load.d/nvidia-uvm.conf"
UDEV_RULE = "/etc/udev/rules.d/70-nvidia-uvm.rules"
RESTART_POLICIES = ("auto", "never", "always")


def _shared(ctx) -> dict:
    """Per-run facts steps hand on (config changed? which control?), kept on the context."""
    st = getattr(ctx, "_lxc_shared", None)
    if st is None:
        st = {}
        setattr(ctx, "_lxc_shared", st)
    return st


def _host_devices(ctx) -> HostDevices:
    return read_host_devices(ctx.host, ctx.box.var("gpubox_gpus"))


def _host_rdev(host):
    """host_rdev for the start model: ("c"|"b", major, minor) of a host path, None if absent."""
    def rdev(path: str):
        import stat as _st

        st = host.stat(path)
        if st is None or not (_st.S_ISCHR(st.mode) or _st.S_ISBLK(st.mode)):
            return None
        return ("c" if _st.S_ISCHR(st.mode) else "b", *(st.rdev or (0, 0)))
    return rdev


def _owned_file(host: str, vmid: int):
    """State file of the NVIDIA majors gpubox saw when it wrote CT <vmid>'s config on <host> (the
    host name is reduced to safe characters plus a hash, so it can never leave the directory)."""
    import hashlib
    import re

    from gpubox.state import state_dir

    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64].lstrip(".") or "host"
    tag = hashlib.sha1(host.encode()).hexdigest()[:8]
    d = state_dir() / "lxc-owned"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{safe}-{tag}-{int(vmid)}.json"


def recorded_majors(host: str, vmid: int) -> set[int]:
    import json

    try:
        data = json.loads(_owned_file(host, vmid).read_text())
        return {int(m) for m in data.get("majors", [])}
    except (OSError, ValueError, TypeError, AttributeError):
        return set()


def record_majors(host: str, vmid: int, majors) -> None:
    import json

    p = _owned_file(host, vmid)
    allm = sorted(recorded_majors(host, vmid) | {int(m) for m in majors})
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"majors": allm}) + "\n")
    os.replace(tmp, p)


def _control(ctx):
    sh = _shared(ctx)
    if "control" not in sh:
        sh["control"] = control_for(ctx)
    return sh["control"]


def _status(ctx) -> dict:
    """Container status, asked once per run until something acts on the container."""
    sh = _shared(ctx)
    if "status" not in sh:
        sh["status"] = _control(ctx).status()
    return sh["status"]


# nvidia-modprobe (NVIDIA/nvidia-modprobe a9556df, nvidia-modprobe.c main): with -u every `-c N` is
# a *uvm* base minor (nvidia_uvm_mknod(N) makes /dev/nvidia-uvm N and -tools N+1), so uvm takes
# exactly `-u -c0`; the GPU nodes /dev/nvidiaN (and nvidiactl = -c255) come from a separate run
# without -u. `-u -c0 -c1` would leave /dev/nvidia-uvm at minor 1 (ENXIO in the container).
UVM_ARGV = ["nvidia-modprobe", "-u", "-c0"]


def gpu_nodes_argv(gpus: int) -> list[str]:
    return ["nvidia-modprobe", *[f"-c{i}" for i in range(max(gpus, 1))], "-c255"]


def modprobe_argvs(gpus: int, *, gpu_nodes: bool = True, uvm: bool = True) -> list[list[str]]:
    """The nvidia-modprobe runs that create the GPU nodes and/or the uvm nodes."""
    return ([gpu_nodes_argv(gpus)] if gpu_nodes else []) + ([list(UVM_ARGV)] if uvm else [])


def needed_modprobe_runs(hd: HostDevices) -> list[list[str]]:
    """Only the runs whose nodes are missing or stale (uvm: also when the module is not loaded)."""
    bad = [n.path for n in hd.nodes if n.required and not n.ok]
    uvm = hd.uvm is None or any(p.startswith("/dev/nvidia-uvm") for p in bad)
    gpu = any(not p.startswith("/dev/nvidia-uvm") for p in bad)
    return modprobe_argvs(hd.gpus, gpu_nodes=gpu, uvm=uvm)


def persist_files(gpus: int) -> dict[str, str]:
    """Boot-time creation of the uvm nodes: nothing on a Proxmox host runs CUDA, so nothing else
    creates /dev/nvidia-uvm (FACTS.md "NVIDIA device nodes")."""
    return {
        MODULES_LOAD: "# Written by gpubox: load nvidia-uvm at boot (LXC GPU containers need it).\nnvidia-uvm\n",
        UDEV_RULE: ("# Written by gpubox: create /dev/nvidia-uvm{,-tools} and the GPU nodes when the modules\n"
                    "# load, before pve-guests starts the containers.\n"
                    f'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia", RUN+="/usr/bin/{" ".join(gpu_nodes_argv(gpus))}"\n'
                    f'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia_uvm", RUN+="/usr/bin/{" ".join(UVM_ARGV)}"\n'),
    }


class HostDevicesStep(Step):
    name = "host-devices"
    title = "NVIDIA device nodes on the Proxmox host"
    where = "host"

    def check(self, ctx) -> Finding:
        hd = _host_devices(ctx)
        ev = {"majors": hd.nvidia_majors(), "gpus": hd.gpus,
              "nodes": {n.path: describe_rdev(n.have) for n in hd.nodes}}
        if hd.frontend is None:
            return Finding.failed("nvidia.ko is not loaded: /proc/devices has no 195 nvidia line",
                                  cause="the NVIDIA kernel driver is not loaded on the host",
                                  repair="install/load the host driver (modprobe nvidia; check dmesg)", **ev)
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
        missing_persist = []
        if ctx.opt("persist"):
            for path, text in persist_files(hd.gpus).items():
                if ctx.host.read_text(path, default="") != text:
                    missing_persist.append(path)
        ev["persist_missing"] = missing_persist
        if problems or missing_persist:
            detail = "; ".join(problems + [f"boot persistence missing: {p}" for p in missing_persist])
            return Finding.drift(detail, cause="nvidia-uvm nodes absent or stale on the host" if problems else
                                 "nothing creates the uvm nodes at boot",
                                 repair="; ".join(" ".join(a) for a in needed_modprobe_runs(hd)
                                                 or modprobe_argvs(hd.gpus, gpu_nodes=False))
                                 + (" (+ --persist)" if problems else ""),
                                 **ev)
        return Finding.ok(f"nvidia {hd.frontend}, nvidia-uvm {hd.uvm}; {hd.gpus} GPU nodes and "
                          f"/dev/nvidia-uvm{{,-tools}} {hd.uvm}:0/1 present", **ev)

    def plan(self, ctx, finding: Finding) -> Plan:
        hd = _host_devices(ctx)
        cmds, files, diffs = [], {}, []
        cmds.extend(needed_modprobe_runs(hd))
        for path in finding.evidence.get("persist_missing", []):
            text = persist_files(hd.gpus)[path]
            files[path] = text
            diffs.append(unified(path, ctx.host.read_text(path, default=""), text))
        what = []
        if cmds:
            what.append("create the nodes with nvidia-modprobe")
        if files:
            what.append(f"write {', '.join(files)}")
        return Plan(" and ".join(what), "".join(diffs), cmds, {"files": files})

    def apply(self, ctx, plan: Plan) -> None:
        for argv in plan.commands:
            ctx.host.run(argv, become=True, timeout=60).check()
        for path, text in (plan.data or {}).get("files", {}).items():
            ctx.host.write(path, text, mode=0o644)


class ContainerConfigStep(Step):
    name = "container-config"
    title = "GPU devices in the container config"
    where = "host"
    requires = ("host-devices",)

    def check(self, ctx) -> Finding:
        vmid = ctx.box.vmid
        path = conf_path(vmid)
        conf, dig = read_conf(ctx.host, vmid)
        var = ctx.box.var("gpubox_device_mode", None)
        mode = None if var is None else str(var)  # None: follow how the config already passes nodes
        ev = {"path": path, "digest": dig, "mode": mode or "follow", "snapshots": conf.snapshots}
        pend = conf.pending
        if pend is not None:
            ev["pending"] = [l.raw.strip() for l in pend.lines if l.key]
        if conf.lock:
            return Finding.failed(f"{path} is locked ({conf.lock}): not editing it",
                                  cause=f"a {conf.lock} is in progress on CT {vmid}",
                                  repair="wait for it to finish and re-run; `pct unlock "
                                         f"{vmid}` only if no {conf.lock} runs", **ev)
        rev = review(conf, _host_devices(ctx), mode, _host_rdev(ctx.host),
                     recorded_majors(ctx.host.name, vmid))
        ev["issues"] = [{"kind": i.kind, "text": i.text} for i in rev.issues]
        ev["warnings"] = rev.warnings
        _shared(ctx)["review"] = (rev, dig)
        note = ""
        if pend is not None and ev["pending"]:
            note = f" (pending, applied at the next restart: {', '.join(ev['pending'])})"
        refused = [i for i in rev.issues if not i.fixable and i.kind != "devN-node-missing"]
        if refused:
            return Finding.failed("; ".join(i.text for i in refused) + note,
                                  cause="a line gpubox does not own stops the container from starting",
                                  repair=f"edit {path} by hand as said, then re-run", **ev)
        if rev.issues:
            causes = "; ".join(i.text for i in rev.issues)
            stale = [i for i in rev.issues if i.kind == "stale-rule"]
            return Finding.drift(causes + note,
                                 cause="stale nvidia-uvm major in the cgroup rule" if stale else
                                 "the main section does not match the host's NVIDIA devices",
                                 repair=f"gpubox lxc fix {ctx.box.name} (rewrites the main section only)", **ev)
        extra = f"; warnings: {'; '.join(rev.warnings)}" if rev.warnings else ""
        how = mode or "as configured"
        return Finding.ok(f"{path} main section matches the host ({how}){note}{extra}", **ev)

    def plan(self, ctx, finding: Finding) -> Plan:
        rev, dig = _shared(ctx)["review"]
        path = finding.evidence["path"]
        if not rev.changed:
            return Plan()
        return Plan(f"rewrite the main section of {path}", rev.diff(path), [], {"text": rev.new, "digest": dig})

    def apply(self, ctx, plan: Plan) -> None:
        if not plan.data:
            raise GpuboxError("the config issues cannot be fixed in the file",
                              "fix host-devices first (the nodes devN names must exist on the host)")
        backup = write_conf(ctx.host, ctx.box.vmid, plan.data["text"], plan.data["digest"])
        record_majors(ctx.host.name, ctx.box.vmid, _host_devices(ctx).nvidia_majors().values())
        _shared(ctx)["conf_changed"] = True
        _shared(ctx)["conf_backup"] = backup


class ContainerStep(Step):
    name = "container"
    title = "GPU nodes usable in the running container"
    where = "host"
    requires = ("container-config",)

    def check(self, ctx) -> Finding:
        ctl = _control(ctx)
        st = _status(ctx)
        ev = {"status": st["status"], "control": ctl.kind, "lock": st.get("lock")}
        if st.get("lock"):
            return Finding.failed(f"CT {ctl.vmid} is locked ({st['lock']})", cause=f"{st['lock']} in progress",
                                  repair="wait for it to finish, then re-run", **ev)
        if st["status"] != "running":
            return Finding.drift(f"CT {ctl.vmid} is {st['status']}", cause="the container is not running",
                                 repair=f"gpubox lxc fix {ctx.box.name} (starts it)", need="start", **ev)
        hd = _host_devices(ctx)
        nodes = [n.path for n in hd.pass_nodes()]
        res = cuda_probe.probe(ctx.container, nodes)
        if res.get("error"):
            return Finding.failed(f"in-container probe failed: {res['error']}",
                                  repair="check that python3 exists in the container", **ev)
        bad = {p: s for p, s in res["nodes"].items() if s != "ok"}
        ev["nodes"] = res["nodes"]
        changed = bool(_shared(ctx).get("conf_changed"))
        if not bad:
            if changed and ctx.opt("restart", "auto") == "always":
                return Finding.drift("nodes usable, but the config changed and --restart always",
                                     need="reboot", **ev)
            return Finding.ok(f"CT {ctl.vmid} running; {len(res['nodes'])} NVIDIA nodes open fine", **ev)
        detail = ", ".join(f"{p}: {s}" for p, s in bad.items())
        if all(s == "EPERM" for s in bad.values()):
            majors = sorted({hd.node(p).want[0] for p in bad if hd.node(p) and hd.node(p).want})
            return Finding.drift(detail, cause="the live device cgroup denies them (rule missing/stale at start)",
                                 repair="live-apply the rules with lxc-cgroup (no restart)", need="live",
                                 majors=majors, **ev)
        return Finding.drift(detail, cause="nodes missing or stale in the container (bound at start)",
                             repair="restart the container so LXC binds the host's current nodes",
                             need="reboot", **ev)

    def plan(self, ctx, finding: Finding) -> Plan:
        ctl = _control(ctx)
        need = finding.evidence["need"]
        policy = ctx.opt("restart", "auto")
        if policy not in RESTART_POLICIES:
            raise GpuboxError(f"--restart {policy!r} is not known", "use auto, never or always")
        if need == "live" and policy == "always":
            need = "reboot"
        if need == "live":
            cmds = [["lxc-cgroup", "-n", str(ctl.vmid), "devices.allow", f"c {m}:* rwm"]
                    for m in finding.evidence["majors"]]
            return Plan("live-apply the device rules (lxc-cgroup)", "", cmds, {"action": "live"})
        action = "start" if need == "start" else "reboot"
        pend = _shared(ctx).get("review")
        note = ""
        if pend:
            conf, _ = read_conf(ctx.host, ctx.box.vmid)
            if conf.pending is not None and any(l.key for l in conf.pending.lines):
                note = " (this also applies the pending changes)"
        return Plan(f"{action} CT {ctl.vmid}{note}", "", [ctl.describe(action)], {"action": action})

    def apply(self, ctx, plan: Plan) -> None:
        ctl = _control(ctx)
        action = plan.data["action"]
        _shared(ctx).pop("status", None)
        if action == "live":
            for argv in plan.commands:
                ctx.host.run(argv, become=True, timeout=30).check()
            return
        policy = ctx.opt("restart", "auto")
        if policy == "never":
            raise GpuboxError(f"CT {ctl.vmid} needs a {action} to pick up the device changes; not done (--restart never)",
                              f"run `{' '.join(ctl.describe(action))}` when convenient, or re-run with --restart auto --yes")
        if action == "reboot" and policy == "auto" and not ctx.opt("yes"):
            confirm = ctx.opt("confirm")
            if not (callable(confirm) and confirm(f"Restart CT {ctl.vmid} ({ctx.box.name}) now?")):
                raise GpuboxError(f"CT {ctl.vmid} needs a restart to pick up the device changes; not restarted without consent",
                                  "re-run with --yes (or answer yes at the prompt)")
        ctl.act(action)


class CudaStep(Step):
    name = "cuda"
    title = "CUDA inside the container"
    where = "container"
    requires = ("container",)

    def check(self, ctx) -> Finding:
        st = _status(ctx)
        if st["status"] != "running":
            return Finding.failed(f"cannot probe CUDA: CT {ctx.box.vmid} is {st['status']}",
                                  cause="the container is not running",
                                  repair=f"gpubox lxc fix {ctx.box.name} (starts it)")
        res = cuda_probe.probe(ctx.container)
        ev = {k: res.get(k) for k in ("nodes", "cuinit", "cuinit_name", "nvml", "kernel_driver", "user_driver",
                                      "simulated", "error")}
        found = cuda_probe.diagnose(res, ctx.box.name)
        if found:
            ev["causes"] = [{"code": c, "cause": why, "repair": fix} for c, why, fix in found]
            return Finding.failed("; ".join(why for _, why, _ in found), cause=found[0][1], repair=found[0][2], **ev)
        nv = (res.get("nvml") or {}).get("count")
        return Finding.ok(f"cuInit(0) = 0; NVML sees {nv} GPUs; driver {res.get('kernel_driver')} "
                          f"(host) = {res.get('user_driver')} (container)", **ev)

    def apply(self, ctx, plan: Plan) -> None:  # pragma: no cover - check never drifts
        pass


def steps(ctx=None) -> list[Step]:
    """The LXC GPU-access steps in dependency order (also used by `gpubox recover`/`doctor`)."""
    return [HostDevicesStep(), ContainerConfigStep(), ContainerStep(), CudaStep()]
