"""NVIDIA driver packages on the host against the driver that is loaded.

apt (and unattended-upgrades, which Debian and Proxmox hosts often run) upgrades the driver's
userspace and the fabric manager while the old kernel module stays loaded until the next reboot:
NVML then fails with "Driver/library version mismatch" (CUDA 803), and a fabric manager of another
version than the module does not start ("fabric manager NVIDIA GPU driver interface version ...
don't match with driver version", CUDA 802). Public reports: lyulyul/shine-cluster#50 (an
`unattended-upgrade` run moved libnvidia-common-460 to 460.80 under a loaded 460.73.01),
pando85/homelab#4110 ("Driver/library version mismatch" after unattended upgrades),
Azure/azhpc-images#86 (apt moved the fabric manager away from a .run driver: "you will get a cuda
initialization error"). The fix the threads settled on is to keep apt off these packages --
`apt-mark hold` (apt-mark(8): a held package is not upgraded, unattended-upgrades skips it) or a
pin in /etc/apt/preferences.d -- and to upgrade them on purpose, together, with a reboot.

Read, never changed: the dpkg database (/var/lib/dpkg/status, dpkg(1)), the loaded module's
version (/sys/module/nvidia/version, else /proc/driver/nvidia/version), apt's history log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubox.errors import GpuboxError
from gpubox.facts import Fact

STATUS = "/var/lib/dpkg/status"
HISTORY = "/var/log/apt/history.log"
STATUS_LIMIT = 64 << 20  # a Proxmox host's status file is a few MB
HISTORY_LIMIT = 16 << 20
# Packages whose version is the driver's own (NVIDIA's CUDA repository, Ubuntu's and Debian's
# packaging); nvidia-settings, -modprobe and -persistenced have versions of their own.
DRIVER_PKG = re.compile(
    r"^(nvidia-driver|nvidia-open|nvidia-dkms|nvidia-kernel-(?:common|source|dkms|open-dkms)|"
    r"nvidia-utils|nvidia-compute-utils|nvidia-headless(?:-no-dkms)?|nvidia-smi|cuda-drivers|"
    r"libnvidia-(?:compute|common|gl|cfg1|ml1|decode|encode|extra|fbc1|ifr1|nvcuvid)|libcuda1|"
    r"firmware-nvidia-gsp)(?:-\d+)?(?:-server)?(?:-open)?$"
)
FABRIC_PKG = re.compile(r"^(nvidia-fabricmanager|cuda-drivers-fabricmanager)(?:-\d+)?(?:-server)?$")
_VERSION = re.compile(r"\d+(?:\.\d+)+")


@dataclass
class Package:
    name: str
    version: str  # as dpkg has it, e.g. "550.127.05-0ubuntu1"
    held: bool = False  # dpkg selection "hold" (apt-mark hold)


@dataclass
class PkgFacts:
    module: str | None = None  # the loaded nvidia.ko's version, None when not loaded
    packages: list[Package] | None = None  # None: no dpkg database on the host
    history: str = ""  # /var/log/apt/history.log (the unattended runs that touched them)


def upstream(version: str) -> str | None:
    """The driver version in a Debian version string: epoch and revision dropped
    ("1:550.127.05-0ubuntu0.22.04.1" -> "550.127.05")."""
    m = _VERSION.match(version.split(":", 1)[-1])
    return m.group(0) if m else None


def parse_status(text: str) -> list[Package]:
    """Pure: the installed NVIDIA driver and fabric manager packages of a dpkg status file."""
    out = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                k, v = line.split(":", 1)
                fields[k.strip()] = v.strip()
        name, status = fields.get("Package", ""), fields.get("Status", "").split()
        if not (DRIVER_PKG.match(name) or FABRIC_PKG.match(name)) or "Version" not in fields:
            continue
        if len(status) == 3 and status[2] == "installed":
            out.append(Package(name, fields["Version"], status[0] == "hold"))
    return sorted(out, key=lambda p: p.name)


def unattended_runs(history: str, names: set[str]) -> list[tuple[str, list[str]]]:
    """Pure: (start date, ["pkg (old, new)", ...]) of the unattended-upgrade runs in apt's history
    that upgraded any of NAMES, oldest first (apt's history.log: Start-Date / Commandline / Upgrade)."""
    out = []
    for block in history.split("\n\n"):
        fields = {}
        for line in block.strip().splitlines():
            if ": " in line:
                k, v = line.split(": ", 1)
                fields[k] = v
        if "unattended-upgrade" not in fields.get("Commandline", ""):
            continue
        ups = re.findall(r"([^\s,:]+)(?::\w+)? \(([^)]*)\)", fields.get("Upgrade", ""))
        hit = [f"{n} ({v})" for n, v in ups if n in names]
        if hit:
            out.append((fields.get("Start-Date", "?"), hit))
    return out


def module_version(sys_version: str, proc_version: str) -> str | None:
    """The loaded module's version: /sys/module/nvidia/version, else the NVRM line of
    /proc/driver/nvidia/version ("... Kernel Module  550.120  ..."); None when not loaded."""
    v = sys_version.strip()
    if _VERSION.fullmatch(v):
        return v
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", proc_version)
    return m.group(1) if m else None


def decide(f: PkgFacts) -> tuple[str, str, str | None, str | None]:
    """Pure: (status, detail, cause, repair)."""
    if f.packages is None:
        return "skipped", f"no dpkg database on the host ({STATUS})", None, None
    if not f.packages:
        return (
            "ok",
            "no NVIDIA driver or fabric manager package from apt (driver installed otherwise)",
            None,
            None,
        )
    if f.module is None:
        return (
            "skipped",
            "nvidia.ko is not loaded: nothing to compare the packages with (host-devices says why)",
            None,
            None,
        )
    off = [p for p in f.packages if upstream(p.version) not in (None, f.module)]
    loose = [p.name for p in f.packages if not p.held]
    hold = f"apt-mark hold {' '.join(p.name for p in f.packages)}"
    keep = (
        f"then keep apt off them: {hold} (unattended-upgrades skips held packages; or pin them in "
        "/etc/apt/preferences.d), and upgrade them on purpose, all together (apt-mark unhold, "
        "upgrade, reboot)"
    )
    if off:
        runs = unattended_runs(f.history, {p.name for p in off})
        by = f"; unattended-upgrade upgraded {', '.join(runs[-1][1])} on {runs[-1][0]}" if runs else ""
        shown = ", ".join(f"{p.name} {p.version}" for p in off)
        fabric = any(FABRIC_PKG.match(p.name) for p in off)
        return (
            "failed",
            f"the loaded driver is {f.module}, the installed packages are not: {shown}{by}",
            "the packages were upgraded under the loaded module"
            + (" by unattended-upgrades" if runs else "")
            + ": NVML fails with 'Driver/library version mismatch' (CUDA 803) until a reboot"
            + (
                "; a fabric manager of another version than the driver does not start (CUDA 802)"
                if fabric
                else ""
            ),
            f"on the host: reboot to load the installed driver (or install {f.module} of every package "
            f"again); {keep}",
        )
    note = (
        f"; not held: {', '.join(loose)} ({hold} keeps an unattended upgrade off them)" if loose else "; held"
    )
    return "ok", f"{len(f.packages)} NVIDIA package(s) at the loaded driver {f.module}{note}", None, None


class PkgFact(Fact):
    """The dpkg database's NVIDIA packages, the loaded module's version and apt's history (bounded
    reads of regular files; an unreadable history is read as empty)."""

    @staticmethod
    def read(host) -> PkgFacts:
        facts = PkgFacts(
            module_version(
                host.read_text("/sys/module/nvidia/version", default=""),
                host.read_text("/proc/driver/nvidia/version", default=""),
            )
        )
        try:
            raw = host.read_bounded(STATUS, STATUS_LIMIT)
        except (OSError, GpuboxError):  # absent (not Debian), or not a regular file: not judged
            return facts
        facts.packages = parse_status(raw.decode("utf-8", "replace"))
        if facts.packages:
            try:
                facts.history = host.read_bounded(HISTORY, HISTORY_LIMIT).decode("utf-8", "replace")
            except (OSError, GpuboxError):
                facts.history = ""
        return facts
