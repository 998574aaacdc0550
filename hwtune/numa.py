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
from dataclasses import dataclass
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.facts import Fact
from gpubox.steps import OMIT, Finding, HostPath, Plan, Run, Step, Write

KNOB = "/proc/sys/kernel/numa_balancing"
CONF = "/etc/sysctl.d/90-gpubox-numa.conf"
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"
MEANING = {0: "off", 1: "on", 2: "memory tiering"}
_LINE = re.compile(r"\s*-?kernel[./]numa_balancing\s*=\s*(\S+)")


def desired(ctx) -> int:
    v = ctx.box.var("gpubox_numa_balancing", 0)
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = -1
    if n not in MEANING:
        raise GpuboxError(f"gpubox_numa_balancing = {v!r} is not 0, 1 or 2", "set it to 0 (off) in the inventory")
    return n


# --- facts ------------------------------------------------------------------------------------

class LiveValue(Fact):
    """The live kernel.numa_balancing; None when the kernel has no NUMA balancing."""

    @staticmethod
    def read(host) -> str:
        return host.read_text(KNOB, default="")

    @staticmethod
    def parse(raw: str) -> int | None:
        text = raw.strip()
        return int(text) if text else None


class SysctlFiles(Fact):
    """Every sysctl.d file systemd-sysctl would apply (a name in an earlier directory hides the
    same name in a later one), as [(path, text)] in application order, then /etc/sysctl.conf."""

    @staticmethod
    def read(host) -> list[tuple[str, str]]:
        files: dict[str, str] = {}
        for d in SYSCTL_DIRS:
            try:
                names = host.listdir(d)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for n in names:
                if n.endswith(".conf") and n not in files:
                    files[n] = f"{d}/{n}"
        out = [(files[n], host.read_text(files[n], default="")) for n in sorted(files)]
        return out + [(SYSCTL_CONF, host.read_text(SYSCTL_CONF, default=""))]

    @staticmethod
    def parse(raw: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(p, t) for p, t in raw]


class FileText(Fact):
    """A file's text, "" when absent."""

    @staticmethod
    def read(host, path: str) -> str:
        return host.read_text(path, default="")


def read_live(host) -> int | None:
    """Current value, None when the kernel has no NUMA balancing."""
    return LiveValue.parse(LiveValue.read(host))


def boot_value(files: list[tuple[str, str]]) -> tuple[int | None, str | None]:
    """The value sysctl.d applies at boot and the file it comes from: files apply in name order,
    the last one wins; /etc/sysctl.conf is applied last (99-sysctl.conf link on Debian)."""
    value, source = None, None
    for path, text in files:
        for line in text.splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            if path == SYSCTL_CONF and not m.group(1).isdigit():
                continue
            try:
                value, source = int(m.group(1)), path
            except ValueError:
                pass
    return value, source


def boot_setting(host) -> tuple[int | None, str | None]:
    return boot_value(SysctlFiles.read(host))


def conf_text(value: int) -> str:
    return ("# Managed by gpubox (hwtune numa): automatic NUMA page migration off for GPU serving.\n"
            f"kernel.numa_balancing = {value}\n")


# --- the step ---------------------------------------------------------------------------------

@dataclass
class Facts:
    live: int | None
    sysctl_files: list[tuple[str, str]] | None = None     # read only with persist
    own_conf: str | None = None


@dataclass
class Options:
    want: int
    persist: bool = False
    box: str = "BOX"


@dataclass
class Evidence:
    live: int | None
    want: Any = OMIT
    boot: Any = OMIT
    boot_source: Any = OMIT


class NumaBalancingStep(Step):
    name = "numa-balancing"
    title = "kernel.numa_balancing"
    where = "host"

    def options(self, ctx) -> Options:
        return Options(desired(ctx), bool(ctx.opt("persist")), ctx.box.name)

    def gather(self, ctx) -> Facts:
        live = ctx.fact(LiveValue)
        if live is None or not ctx.opt("persist"):
            return Facts(live)
        return Facts(live, ctx.fact(SysctlFiles), ctx.fact(FileText, CONF))

    def decide(self, facts: Facts, opts: Options) -> Finding:
        live, want = facts.live, opts.want
        if live is None:
            return Finding.ok("kernel has no NUMA balancing (no CONFIG_NUMA_BALANCING): nothing to do",
                              evidence=Evidence(None))
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
                problems.append(f"at boot: {boot if boot is not None else 'kernel default'}{where}, "
                                f"want {want} from {CONF}{later}")
            if not mine:
                actions.append(Write(CONF, conf, old=facts.own_conf or ""))
        if not problems:
            return Finding.ok(f"kernel.numa_balancing = {live} ({MEANING[live]})"
                              + (f"; persisted in {CONF}" if opts.persist else ""), evidence=ev)
        desc = [f"write {want} to {KNOB}"] if live != want else []
        if any(isinstance(a, Write) for a in actions):
            desc.append(f"persist in {CONF}")
        return Finding.drift("; ".join(problems), cause="default after reboot" if live != want else None,
                             repair=f"gpubox tune numa {opts.box}" + (" --persist" if opts.persist else ""),
                             plan=Plan(" and ".join(desc), actions=actions), evidence=ev)
