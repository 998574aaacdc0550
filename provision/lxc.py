"""Steps that give the LXC container working GPU access after a host reboot, in dependency order:

  host-devices      NVIDIA majors and nodes on the Proxmox host (nvidia-modprobe -c0..-cN-1 -c255,
                    then -u -c0; --persist: modules-load.d + udev rule so the next boot creates them)
  container-config  the main section of /etc/pve/lxc/<vmid>.conf agrees with the host's majors
                    and nodes (safe write: lock, digest, tmp + rename, backup)
  container         the running container sees the nodes: live-apply cgroup rules with lxc-cgroup
                    where that suffices, else (re)start per --restart auto|never|always
  cuda              the in-container probe: open() errno, cuInit, NVML, driver versions

Options read from ctx.options (the CLI and the recover pipeline pass them): dry_run, yes,
restart ("auto" | "never" | "always"), persist, confirm (callable(question) -> bool, optional).

This module holds the facts these steps read (what is on the host, the container's config and
state, the in-container probe) and the pure helpers they decide with; the steps themselves live
in provision/host_devices_step.py, container_config_step.py, container_step.py and cuda_step.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpubox.facts import Fact, FileText  # noqa: F401 - FileText: the LXC steps read it from here

from . import cuda_probe
from .devices import HostDevices
from .lxcconf import LxcConf, conf_path, read_conf
from .lxcmodel import MOUNT, devn_path
from .pve import control_for

MODULES_LOAD = "/etc/modules-load.d/nvidia-uvm.conf"
UDEV_RULE = "/etc/udev/rules.d/70-nvidia-uvm.rules"
RESTART_POLICIES = ("auto", "never", "always")


def _control(ctx):
    """The container's control (pct or the Proxmox API); bad API settings raise GpuboxError."""
    return control_for(ctx)


def gpus_wanted(ctx):
    """The inventory's gpubox_gpus for the box (None when unset): how many GPUs it should have."""
    return ctx.box.var("gpubox_gpus")


def _owned_file(host: str, vmid: int):
    """State file of the NVIDIA majors gpubox saw when it wrote CT <vmid>'s config on <host> (the
    host name is reduced to safe characters plus a hash, so it can never leave the directory)."""
    import hashlib
    import re

    from gpubox.state import sub_dir

    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64].lstrip(".") or "host"
    tag = hashlib.sha1(host.encode()).hexdigest()[:8]
    return sub_dir("lxc-owned") / f"{safe}-{tag}-{int(vmid)}.json"  # made with no link followed


def _read_record(host: str, vmid: int) -> dict:
    try:
        data = json.loads(_owned_file(host, vmid).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_majors(host: str, vmid: int) -> set[int]:
    try:
        return {int(m) for m in _read_record(host, vmid).get("majors", [])}
    except (ValueError, TypeError, AttributeError):
        return set()


def _write_record(host: str, vmid: int, data: dict) -> None:
    from gpubox.safeio import write_text

    write_text(_owned_file(host, vmid), json.dumps(data) + "\n")  # a new temp renamed in, no link followed


def record_majors(host: str, vmid: int, majors, *, restart_due: str | None = None) -> None:
    """Add `majors` to the record; `restart_due` (the digest gpubox wrote) marks that the running
    container has not been restarted since gpubox changed its config."""
    data = _read_record(host, vmid)
    data["majors"] = sorted(recorded_majors(host, vmid) | {int(m) for m in majors})
    if restart_due:
        data["restart_due"] = restart_due
    _write_record(host, vmid, data)


def clear_restart_due(host: str, vmid: int) -> None:
    """The container was (re)started by gpubox: it runs the config as it is now."""
    data = _read_record(host, vmid)
    if data.pop("restart_due", None) is not None:
        _write_record(host, vmid, data)


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


def persist_files(gpus: int, optional: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """Boot-time creation of the uvm nodes: nothing on a Proxmox host runs CUDA, so nothing else
    creates /dev/nvidia-uvm (docs/facts.md "NVIDIA device nodes"). `optional`: optional nodes the
    container's devN entries require (/dev/nvidia-modeset): their nvidia-modprobe run is added, so
    the start does not depend on what the driver happens to create."""
    from .nodehints import BOOT_RUNS

    gpu_run, uvm_run = " ".join(gpu_nodes_argv(gpus)), " ".join(UVM_ARGV)
    extra = "".join(
        f'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia", RUN+="/usr/bin/{" ".join(BOOT_RUNS[p])}"\n'
        for p in sorted(set(optional))
        if p in BOOT_RUNS
    )
    return {
        MODULES_LOAD: (
            "# Written by gpubox: load nvidia-uvm at boot (LXC GPU containers need it).\nnvidia-uvm\n"
        ),
        UDEV_RULE: (
            "# Written by gpubox: create /dev/nvidia-uvm{,-tools} and the GPU nodes when the "
            "modules\n# load, before pve-guests starts the containers.\n"
            f'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia", RUN+="/usr/bin/{gpu_run}"\n'
            f'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia_uvm", RUN+="/usr/bin/{uvm_run}"\n' + extra
        ),
    }


# --- facts ------------------------------------------------------------------------------------


class ConfText(Fact):
    """/etc/pve/lxc/<vmid>.conf as text (a missing file is bad input, as read_conf says)."""

    @staticmethod
    def read(host, vmid: int) -> str:
        path = conf_path(vmid)
        try:
            raw = host.read_bytes(path)
        except FileNotFoundError:
            read_conf(host, vmid)  # raises its one-line error
            raise
        return raw.decode()


@dataclass
class OwnRecord:
    majors: list[int] = field(default_factory=list)
    restart_due: bool = False


class OwnedRecord(Fact):
    """gpubox's record for CT <vmid> on this host (state dir on the control node): the NVIDIA
    majors it saw when it last wrote the config, and whether a restart is due since."""

    @staticmethod
    def read(host, vmid: int) -> dict:
        return _read_record(host.name, vmid)

    @staticmethod
    def parse(raw: dict, vmid: int) -> OwnRecord:
        try:
            majors = sorted({int(m) for m in raw.get("majors", [])})
        except (ValueError, TypeError, AttributeError):
            majors = []
        return OwnRecord(majors, bool(raw.get("restart_due")))


def _host_rdev(host):
    """host_rdev for the start model: ("c"|"b", major, minor) of a host path, None if absent."""

    def rdev(path: str):
        import stat as _st

        if not path.startswith("/"):  # a relative mount source: lxc never reads it under the host root
            return None
        st = host.stat(path)
        if st is None or not (_st.S_ISCHR(st.mode) or _st.S_ISBLK(st.mode)):
            return None
        return ("c" if _st.S_ISCHR(st.mode) else "b", *(st.rdev or (0, 0)))

    return rdev


class HostRdev(Fact):
    """("c"|"b", major, minor) of each given host path; "file" / "dir" where something that is no
    device is there (a bind-mounted nvidia-smi or libcuda exists as a plain file: lxc mounts it);
    None where absent (a relative path: lxc resolves it against its own working directory)."""

    @staticmethod
    def read(host, paths: tuple[str, ...]) -> dict[str, Any]:
        import stat as _st

        rdev = _host_rdev(host)
        out: dict[str, Any] = {}
        for p in paths:
            out[p] = rdev(p)
            if out[p] is None and p.startswith("/"):
                st = host.stat(p)
                if st is not None:
                    out[p] = "dir" if _st.S_ISDIR(st.mode) else "file"
        return out


class ContainerStatus(Fact):
    """{'status': running|stopped|..., 'lock': str|None} through the container's control."""

    @staticmethod
    def read(host, control) -> dict:
        return control.status()


class CudaProbe(Fact):
    """The in-container probe's JSON (provision.cuda_probe), or {'error': ...}."""

    where = "container"

    @staticmethod
    def read(container, *nodes: str) -> dict:
        return cuda_probe.probe(container, list(nodes))


# --- pure helpers the steps decide with --------------------------------------------------------


def referenced_paths(conf_text: str, hd: HostDevices) -> list[str]:
    """Every host path the start model may stat for this config (provision.lxcmodel.StartModel):
    devN paths, mount sources, the NVIDIA nodes a fix may add, and each of those under a mount
    target (the autodev hook's EEXIST check)."""
    main = LxcConf.parse(conf_text).main.lines
    devn = [devn_path(l.value) for l in main if l.key and l.key.startswith("dev") and l.key[3:].isdigit()]
    nodes = [n.path for n in hd.nodes]
    mounts = []
    for l in main:
        f = (l.value or "").split() if l.key == MOUNT else []
        if len(f) >= 4:
            mounts.append((f[0], f[1].strip("/")))
    includes = [(l.value or "").strip() for l in main if l.key == "lxc.include"]
    out = [p for p in devn if p] + nodes + [src for src, _ in mounts] + [p for p in includes if p]
    for path in [p for p in devn if p] + nodes:
        for src, target in mounts:
            rel = path.strip("/")
            if rel == target or rel.startswith(target + "/"):
                out.append(src.rstrip("/") + path[len("/" + target) :])
    return sorted(set(out))


def pending_lines(conf_text: str) -> list[str] | None:
    """The keyed lines of `[pve:pending]` (None: no pending section)."""
    pend = LxcConf.parse(conf_text).pending
    return None if pend is None else [l.raw.strip() for l in pend.lines if l.key]
