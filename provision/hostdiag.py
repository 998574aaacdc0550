"""Why nvidia.ko is not loaded on the host: most often a kernel upgrade that left the new kernel
without an NVIDIA module (DKMS did not build it, typically because the matching headers were not
installed), so after the reboot nothing creates /dev/nvidia*. That is the host's driver install,
not the container config: the finding names DKMS and the headers, and the container-side checks
point back here instead of blaming the container.

Where modules live: /lib/modules/<release>/ (kmod's depmod search path; DKMS installs into
`updates/dkms`, Debian/Proxmox packaged builds use `updates/dkms` too, NVIDIA's .run without DKMS
uses `kernel/drivers/video`); DKMS keeps its per-kernel builds under
/var/lib/dkms/<module>/<version>/<kernel>/ (dkms(8)). The running release is
/proc/sys/kernel/osrelease (what `uname -r` prints).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpubox.facts import Fact

MODULE_DIRS = ("updates/dkms", "updates", "extra", "kernel/drivers/video", "misc")
MODULE_NAMES = ("nvidia.ko", "nvidia.ko.xz", "nvidia.ko.zst", "nvidia.ko.gz")


@dataclass
class KernelModules:
    """The running kernel and where an NVIDIA module exists for it (and for other kernels)."""

    release: str
    module: str | None = None  # path of nvidia.ko for the running kernel, None when none
    headers: bool | None = None  # /lib/modules/<release>/build exists
    others: list[str] = field(default_factory=list)  # other installed kernels that HAVE nvidia.ko
    dkms: list[str] = field(default_factory=list)  # "<version>/<kernel>" builds DKMS holds


def _module_in(host, release: str) -> str | None:
    for d in MODULE_DIRS:
        for n in MODULE_NAMES:
            p = f"/lib/modules/{release}/{d}/{n}"
            if host.exists(p):
                return p
    return None


class KernelModulesFact(Fact):
    """Read only when /proc/devices has no nvidia line: a handful of exists() calls."""

    @staticmethod
    def read(host) -> KernelModules:
        rel = host.read_text("/proc/sys/kernel/osrelease", default="").strip()
        k = KernelModules(rel, _module_in(host, rel) if rel else None)
        if rel:
            k.headers = host.exists(f"/lib/modules/{rel}/build")
        if host.exists("/lib/modules"):
            for other in sorted(host.listdir("/lib/modules"))[-8:]:
                if other != rel and _module_in(host, other):
                    k.others.append(other)
        base = "/var/lib/dkms/nvidia"
        if host.exists(base):
            for ver in sorted(host.listdir(base)):
                if host.exists(f"{base}/{ver}") and not ver.startswith("kernel-"):
                    try:
                        kernels = host.listdir(f"{base}/{ver}")
                    except (NotADirectoryError, FileNotFoundError):
                        continue
                    k.dkms += [f"{ver}/{x}" for x in sorted(kernels) if x not in ("source", "build")]
        return k


def driver_not_loaded(k: KernelModules | None) -> tuple[str, str, str, dict | None]:
    """Pure: (detail, cause, repair, evidence) for a host whose /proc/devices has no nvidia line."""
    detail = "nvidia.ko is not loaded: /proc/devices has no 195 nvidia line"
    if k is None or not k.release:
        return (
            detail,
            "the NVIDIA kernel driver is not loaded on the host",
            "install/load the host driver (modprobe nvidia; check dmesg)",
            None,
        )
    ev = asdict(k)
    rel = k.release
    if k.module is None:
        built = f"; a module exists for {', '.join(k.others)}" if k.others else ""
        dk = f"; DKMS has builds {', '.join(k.dkms)}" if k.dkms else ""
        headers = " and its headers are not installed" if k.headers is False else ""
        return (
            f"{detail}; the running kernel {rel} has no NVIDIA module{built}{dk}",
            f"the kernel was upgraded to {rel}{headers}: DKMS did not build the NVIDIA module for it",
            f"on the host: install the headers for {rel} (Proxmox: apt install proxmox-headers-{rel}; "
            f"pve-headers-{rel} on PVE 7), build the module (dkms autoinstall -k {rel}, or re-run the "
            "NVIDIA .run installer with --dkms), modprobe nvidia, then re-run gpubox; or boot the "
            "previous kernel (proxmox-boot-tool kernel pin)",
            ev,
        )
    return (
        f"{detail}; {k.module} exists for the running kernel {rel}",
        "the NVIDIA module is installed for this kernel but did not load (blacklisted, a Secure Boot "
        "signature refused, or a load error)",
        "on the host: modprobe nvidia and read the NVRM lines in journalctl -k",
        ev,
    )
