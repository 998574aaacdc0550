"""`gpubox sim reboot DIR [--driver-upgrade]`: a Proxmox host's reboot replayed on a simulated box.

What a reboot undoes and what brings things back, in the host's boot order:

1. power off: every container stopped; tmpfs emptied (the container's /dev/shm, /run/lock);
   PCIe Device Control back to the firmware's MaxReadReq (512 bytes on some GPUs);
   kernel.numa_balancing back to 1; no NVIDIA device node and no nvidia-uvm in /proc/devices;
   with --driver-upgrade the next nvidia-uvm load gets a new dynamic major.
2. kernel + udev: nvidia.ko loads for the GPUs; nvidia-uvm only when modules-load.d names it; the
   nodes only where the udev rule (or nothing) creates them: what is persisted, nothing else.
3. systemd: systemd-sysctl applies sysctl.d; the enabled host units run, the MRRS unit and
   gpubox's autostart boot unit (ordered After=pve-cluster, Before=pve-guests) among them.
4. pve-guests: every `onboot: 1` container through `pct start` (the stand-in follows pve-container
   vm_start: pending, update_lxc_config, hookscript pre-start, start, post-start), around a real LXC
   start where this machine has lxc (gpubox.simbox.lxcreal).

Each phase is timed; the figure is the time from power on to a healthy verdict with no command typed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .core import SimBox


@dataclass
class Phase:
    name: str
    seconds: float
    detail: str = ""


@dataclass
class Reboot:
    phases: list[Phase] = field(default_factory=list)
    verdict: str | None = None  # the health check a hook ran, None when nothing ran one
    healthy_after: float | None = None  # seconds from power on to that healthy verdict
    log: list[str] = field(default_factory=list)  # the task output of each start

    def to_dict(self) -> dict:
        return {
            "phases": [
                {"name": p.name, "seconds": round(p.seconds, 2), "detail": p.detail} for p in self.phases
            ],
            "verdict": self.verdict,
            "healthy_after_s": None if self.healthy_after is None else round(self.healthy_after, 2),
            "log": self.log,
        }


def _env(sim: SimBox) -> dict:
    env = dict(os.environ, GPUBOX_SIM=str(sim.dest), GPUBOX_SIM_SIDE="host")
    env["PATH"] = f"{sim.bin_dir}:{env.get('PATH', '')}"
    return env


def _power_off(sim: SimBox, driver_upgrade: bool) -> str:
    from . import pci
    from .cmds import pct
    from .lxc import PROC_DEVICES_CHAR, proc_devices

    with sim.state() as st:
        for ct in st["containers"].values():
            ct.update(status="stopped", cgroup_allow=[])
        for side in st.get("units", {}).values():
            for u in side.values():
                u["active"] = False
        old = st.setdefault("lxc", {}).get("uvm_major", 511)
        if driver_upgrade:  # the dynamic range is handed out downwards; the new module lands elsewhere
            st["lxc"]["uvm_major"] = 510 if old != 510 else 509
        major = st["lxc"]["uvm_major"]
    pct._clear_dev(sim)
    for d in (sim.cpath("/dev/shm"), sim.cpath("/run/lock"), sim.hpath("/run/lock")):
        if d.is_dir():
            for p in d.iterdir():
                subprocess.run(["rm", "-rf", "--one-file-system", str(p)], check=False)
    for p in sim.hpath("/dev").glob("nvidia*"):
        if p.name != "nvidia-caps" and p.name != "nvidia-modeset":
            p.unlink()
    sim.hpath("/proc/devices").write_text(
        proc_devices([c for c in PROC_DEVICES_CHAR if c[1] != "nvidia-uvm"])
    )
    sim.hpath("/proc/sys/kernel/numa_balancing").write_text("1\n")
    for i, bdf in enumerate(pci.gpu_bdfs(sim.gpus)):  # the firmware's MaxReadReq: 512 on GPUs 0, 3, 6, ...
        if i % 3 == 0:
            cfg = sim.hpath(f"/sys/bus/pci/devices/{bdf}/config")
            b = bytearray(cfg.read_bytes())
            off = pci.CAP_EXP + 8
            v = int.from_bytes(b[off : off + 2], "little")
            b[off : off + 2] = ((v & ~0x7000) | (2 << 12)).to_bytes(2, "little")
            cfg.write_bytes(bytes(b))
    return "tmpfs emptied, MRRS 512 on some GPUs, numa_balancing 1" + (
        f", driver upgraded: nvidia-uvm major {old} -> {major}" if driver_upgrade else ""
    )


def _udev_runs(rule: str, kernel: str) -> list[list[str]]:
    out = []
    for line in rule.splitlines():
        if f'KERNEL=="{kernel}"' in line and not line.lstrip().startswith("#"):
            m = re.search(r'RUN\+="([^"]+)"', line)
            if m:
                argv = shlex.split(m.group(1))
                argv[0] = os.path.basename(argv[0])  # /usr/bin/nvidia-modprobe: the stand-in on PATH
                out.append(argv)
    return out


def _kernel(sim: SimBox) -> str:
    """nvidia.ko (the GPUs' modalias) and what modules-load.d asks for; the udev rule's RUN lines."""
    from gpubox.provision import lxc

    env = _env(sim)
    rule = sim.hpath(lxc.UDEV_RULE).read_text() if sim.hpath(lxc.UDEV_RULE).exists() else ""
    loads = sim.hpath(lxc.MODULES_LOAD).read_text() if sim.hpath(lxc.MODULES_LOAD).exists() else ""
    done = ["nvidia"]
    for argv in _udev_runs(rule, "nvidia"):
        subprocess.run(argv, env=env, check=False)
    if re.search(r"^\s*nvidia[-_]uvm\s*$", loads, re.M):
        done.append("nvidia-uvm")
        runs = _udev_runs(rule, "nvidia_uvm")
        # the module's load adds its /proc/devices line even when no rule makes nodes
        for argv in runs or [["nvidia-modprobe", "-u"]]:
            subprocess.run(argv, env=env, check=False)
    return f"modules {', '.join(done)}; udev rule {'ran' if rule else 'absent: no nodes made'}"


def _systemd(sim: SimBox) -> tuple[str, list[str]]:
    """systemd-sysctl, then the enabled host units: the MRRS unit's setpci lines, gpubox's boot unit."""
    from gpubox.hwtune import numa, pcie

    files = []
    d = sim.hpath("/etc/sysctl.d")
    for p in sorted(d.glob("*.conf")) if d.is_dir() else []:
        files.append((f"/etc/sysctl.d/{p.name}", p.read_text()))
    value, _ = numa.boot_value(files)
    if value is not None:
        sim.hpath("/proc/sys/kernel/numa_balancing").write_text(f"{value}\n")
    units = sim.read_state().get("units", {}).get("host", {})
    ran, log = [], []
    unit_dir = sim.hpath("/etc/systemd/system")
    if units.get(pcie.UNIT, {}).get("enabled") and (unit_dir / pcie.UNIT).exists():
        log += mrrs_unit_run(sim, (unit_dir / pcie.UNIT).read_text())
        ran.append(pcie.UNIT)
    for name in sorted(units):
        if not (name.startswith("gpubox-autostart-") and units[name].get("enabled")):
            continue
        text = (unit_dir / name).read_text() if (unit_dir / name).exists() else ""
        m = re.search(r"^ExecStart=(.+)$", text, re.M)
        if not m:
            continue
        env = _env(sim)
        em = re.search(r"^Environment=(\w+)=(\S+)$", text, re.M)
        if em:
            env[em.group(1)] = em.group(2)
        m_limit = re.search(r"^TimeoutStartSec=(\d+)$", text, re.M)
        limit = int(m_limit.group(1)) if m_limit else 90  # systemd's DefaultTimeoutStartSec
        try:
            p = subprocess.run(
                shlex.split(m.group(1)), env=env, capture_output=True, text=True, timeout=limit
            )
            log += (p.stdout + p.stderr).splitlines()
            ran.append(f"{name} (exit {p.returncode})")
        except subprocess.TimeoutExpired:
            ran.append(f"{name} (killed at its limit of {limit} s)")
    with sim.state() as st:
        for u in st.get("units", {}).get("host", {}).values():
            if u.get("enabled"):
                u["active"], u["starts"] = True, u.get("starts", 0) + 1
    return "units: " + (", ".join(ran) or "none of gpubox's"), log


def mrrs_unit_run(sim: SimBox, text: str) -> list[str]:
    """The MRRS unit's ExecStart lines run by the REAL setpci on the simulated sysfs: its `-s BDF
    -d VENDOR:DEVICE:CLASS` selection and masked write are pciutils' own. Returns what they printed,
    as the unit's journal would hold it (a function that changed: 'No devices selected')."""
    from gpubox.hwtune import pcie

    log = []
    for m in re.finditer(r"^ExecStart=(\S*setpci\s.*)$", text, re.M):
        argv = shlex.split(m.group(1))
        argv = ["setpci", "-A", "linux-sysfs", "-O", f"sysfs.path={sim.hpath('/sys/bus/pci')}", *argv[1:]]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        log += [f"{pcie.UNIT}: {line}" for line in (p.stdout + p.stderr).splitlines()]
    return log


def _pve_guests(sim: SimBox, rb: Reboot, t0: float) -> str:
    """pve-guests: `pct start` of each onboot container, in vmid order (startup order not simulated)."""
    from .cmds import pct

    started = []
    for conf in sorted(sim.hpath("/etc/pve/lxc").glob("*.conf")):
        vmid = int(conf.stem)
        if pct.parse_config(conf.read_text(), vmid).get("onboot") != 1:
            continue
        p = subprocess.run(
            [str(sim.bin_dir / "pct"), "start", str(vmid)], env=_env(sim), capture_output=True, text=True
        )
        lines = (p.stdout + p.stderr).splitlines()
        rb.log += [f"CT {vmid}: {line}" for line in lines]
        for line in lines:
            m = re.search(r"post-start: health check: (\w+)", line)
            if m:
                rb.verdict = m.group(1)
                if rb.verdict == "healthy":
                    rb.healthy_after = time.monotonic() - t0
        started.append(f"CT {vmid} {'started' if p.returncode == 0 else f'failed (exit {p.returncode})'}")
    return ", ".join(started) or "no onboot container"


def reboot(dest: str | os.PathLike, driver_upgrade: bool = False) -> Reboot:
    sim = SimBox.load(Path(dest).resolve())
    rb = Reboot()
    t0 = time.monotonic()

    def timed(name, fn):
        t = time.monotonic()
        out = fn()
        detail, extra = out if isinstance(out, tuple) else (out, [])
        rb.log += extra
        rb.phases.append(Phase(name, time.monotonic() - t, detail))

    timed("power off", lambda: _power_off(sim, driver_upgrade))
    timed("kernel + udev", lambda: _kernel(sim))
    timed("systemd (sysctl, host units)", lambda: _systemd(sim))
    timed("pve-guests (onboot starts)", lambda: _pve_guests(sim, rb, t0))
    return rb
