"""kernel.numa_balancing on the Proxmox host.

Facts (FACTS.md "NUMA balancing", kernel admin-guide sysctl/kernel.rst): 0 off, 1 on, 2 memory
tiering; the file is absent when the kernel lacks CONFIG_NUMA_BALANCING (then there is nothing
to do). Automatic page migration moves a serving process's pages between nodes under it; the
seed box measured the tuning (with MRRS and NCCL) at +7.5%/+18.5%.

The live value is written with `tee <root>/proc/sys/kernel/numa_balancing`: a plain
open-truncate-write like `sysctl -w` does (sysctl itself has no root prefix, and /proc/sys
files cannot be replaced by rename, so Host.write's atomic rename does not apply there).
"""

from __future__ import annotations

import re

from gpubox.diffs import unified
from gpubox.errors import GpuboxError
from gpubox.steps import Finding, Plan, Step

KNOB = "/proc/sys/kernel/numa_balancing"
CONF = "/etc/sysctl.d/90-gpubox-numa.conf"
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
MEANING = {0: "off", 1: "on", 2: "memory tiering"}


def desired(ctx) -> int:
    v = ctx.box.var("gpubox_numa_balancing", 0)
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = -1
    if n not in MEANING:
        raise GpuboxError(f"gpubox_numa_balancing = {v!r} is not 0, 1 or 2", "set it to 0 (off) in the inventory")
    return n


def read_live(host) -> int | None:
    """Current value, None when the kernel has no NUMA balancing."""
    text = host.read_text(KNOB, default="").strip()
    if not text:
        return None
    return int(text)


def conf_text(value: int) -> str:
    return ("# Managed by gpubox (hwtune numa): automatic NUMA page migration off for GPU serving.\n"
            f"kernel.numa_balancing = {value}\n")


def boot_setting(host) -> tuple[int | None, str | None]:
    """The value sysctl.d applies at boot and the file it comes from.

    systemd-sysctl reads every *.conf of these directories, a name in an earlier directory hiding
    the same name in a later one, then applies them in name order: the last file wins."""
    files: dict[str, str] = {}
    for d in SYSCTL_DIRS:
        try:
            names = host.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for n in names:
            if n.endswith(".conf") and n not in files:
                files[n] = f"{d}/{n}"
    value, source = None, None
    for n in sorted(files):
        for line in host.read_text(files[n], default="").splitlines():
            m = re.match(r"\s*-?kernel[./]numa_balancing\s*=\s*(\S+)", line)
            if m:
                try:
                    value, source = int(m.group(1)), files[n]
                except ValueError:
                    pass
    conf = host.read_text("/etc/sysctl.conf", default="")
    for line in conf.splitlines():   # /etc/sysctl.conf is applied last (99-sysctl.conf link on Debian)
        m = re.match(r"\s*-?kernel[./]numa_balancing\s*=\s*(\S+)", line)
        if m and m.group(1).isdigit():
            value, source = int(m.group(1)), "/etc/sysctl.conf"
    return value, source


class NumaBalancingStep(Step):
    name = "numa-balancing"
    title = "kernel.numa_balancing"
    where = "host"

    def check(self, ctx) -> Finding:
        host, want = ctx.host, desired(ctx)
        live = read_live(host)
        if live is None:
            return Finding.ok("kernel has no NUMA balancing (no CONFIG_NUMA_BALANCING): nothing to do", live=None)
        problems = []
        if live != want:
            problems.append(f"kernel.numa_balancing = {live} ({MEANING.get(live, '?')}), want {want}")
        ev = {"live": live, "want": want}
        if ctx.opt("persist"):
            boot, src = boot_setting(host)
            ev.update(boot=boot, boot_source=src)
            mine = host.read_text(CONF, default="") == conf_text(want)
            if boot != want or not mine:
                where = f" from {src}" if src else ""
                later = " (a later sysctl file overrides it: fix that file)" if mine else ""
                problems.append(f"at boot: {boot if boot is not None else 'kernel default'}{where}, "
                                f"want {want} from {CONF}{later}")
        if problems:
            return Finding.drift("; ".join(problems), cause="default after reboot" if live != want else None,
                                 repair=f"gpubox tune numa {ctx.box.name}" + (" --persist" if ctx.opt("persist") else ""),
                                 **ev)
        return Finding.ok(f"kernel.numa_balancing = {live} ({MEANING[live]})"
                          + (f"; persisted in {CONF}" if ctx.opt("persist") else ""), **ev)

    def plan(self, ctx, finding: Finding) -> Plan:
        host, want = ctx.host, finding.evidence["want"]
        cmds, diff, conf = [], "", None
        if finding.evidence["live"] != want:
            cmds.append(["tee", host.path(KNOB)])
        if ctx.opt("persist"):
            old = host.read_text(CONF, default="")
            conf = conf_text(want)
            if old != conf:
                diff = unified(CONF, old, conf)
        desc = []
        if cmds:
            desc.append(f"write {want} to {KNOB}")
        if diff:
            desc.append(f"persist in {CONF}")
        return Plan(" and ".join(desc), diff, cmds, {"want": want, "conf": conf if diff else None})

    def apply(self, ctx, plan: Plan) -> None:
        host = ctx.host
        for argv in plan.commands:
            host.run(argv, input=f"{plan.data['want']}\n", timeout=30, check=True)
        if plan.data["conf"]:
            host.write(CONF, plan.data["conf"], mode=0o644)
