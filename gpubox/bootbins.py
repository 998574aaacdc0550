"""The programs a boot artifact runs, and whether the host has them.

A unit, udev rule or hookscript that names a program the host lacks fails at every boot with
nobody watching: a oneshot's failure is one journal line, a udev RUN+= failure is logged at debug
level only (udev(7): RUN programs' exit codes are not acted on). So every absolute program path in
a file gpubox installs for the boot is read back out of that file's own text (`programs`) and
checked on the host (`Executable`) at install and by doctor, and an artifact naming a missing
program is never written.
"""

from __future__ import annotations

import re
import stat

from .facts import Fact

# systemd.service(5): the Exec*= settings; their value may start with the prefixes "-@:+!|".
_EXEC = re.compile(
    r"^\s*Exec(?:Start|StartPre|StartPost|Stop|StopPost|Reload|Condition)\s*=\s*[-@:+!|]*(/\S+)"
)
# udev(7): RUN{...}+="program args", PROGRAM=="...", IMPORT{program}=="..."
_UDEV = re.compile(r'(?:\bRUN(?:\{program\})?\+?=|\bPROGRAM==|\bIMPORT\{program\}==)"\s*(/[^"\s]+)')
_SHEBANG = re.compile(r"^#!\s*(/\S+)")
_EXEC_SH = re.compile(r"^\s*exec\s+(/\S+)")  # a shell script's `exec /path/prog ...`


def programs(text: str) -> list[str]:
    """Pure: the absolute program paths a unit / udev rule / shell script runs, in order, once
    each (comment lines count for nothing, a shebang does)."""
    out: list[str] = []
    for i, line in enumerate((text or "").splitlines()):
        m = _SHEBANG.match(line) if i == 0 else None
        if m is None and line.lstrip().startswith("#"):
            continue
        found = [m.group(1)] if m else []
        found += [x.group(1) for x in (_EXEC.match(line), _EXEC_SH.match(line)) if x]
        found += _UDEV.findall(line)
        out += [p for p in found if p not in out]
    return out


class Executable(Fact):
    """Whether PATH is an executable file on the host: a regular file with an execute bit, or a
    link that `test -x` accepts there (a program reached through an alternatives link)."""

    @staticmethod
    def read(host, path: str) -> bool:
        st = host.stat(path)
        if st is None:
            return False
        if stat.S_ISLNK(st.mode):
            return host.run(["test", "-x", host.path(path)], timeout=20).rc == 0
        return st.is_file and bool(st.mode & 0o111)


def missing(fact, texts) -> list[str]:
    """The programs the given artifact texts run that the host lacks, read through `fact`
    (ctx.fact): what a step refuses to install."""
    seen: list[str] = []
    for t in texts:
        seen += [p for p in programs(t) if p not in seen]
    return [p for p in seen if not fact(Executable, p)]


# What to install for each program gpubox's boot artifacts run (Debian / Proxmox packages).
HINTS = {
    "/usr/bin/setpci": "apt install pciutils",
    "/usr/bin/nvidia-modprobe": "the NVIDIA driver's nvidia-modprobe (apt install nvidia-modprobe, or the "
    "driver's .run installer)",
    "/usr/bin/env": "coreutils",
    "/usr/bin/timeout": "coreutils",
    "/bin/sh": "dash",
}


def refusal(paths: list[str], what: str) -> tuple[str, str, str]:
    """(detail, cause, repair) for a boot artifact that would run programs the host lacks."""
    shown = ", ".join(paths)
    hints = "; ".join(f"{p}: {HINTS[p]}" for p in paths if p in HINTS)
    return (
        f"{what} would run {shown}, not on the host: not installed",
        "a boot artifact naming a missing program fails at every boot, with only a journal line to say so",
        f"install it on the host ({hints or 'the package that provides it'}), then re-run",
    )
