"""Optional NVIDIA nodes that a container config turns into start requirements.

`/dev/nvidia-modeset` (195:254) is created by nvidia-modprobe only when asked (`-m`,
NVIDIA/nvidia-modprobe nvidia-modprobe.c) or by a display stack; a headless Proxmox host with a
recent driver no longer has it after boot. A `lxc.mount.entry ... optional` line for it is
harmless, but a `devN: /dev/nvidia-modeset` entry is not: pve-container's autodev hook mknod()s
every devN path from the host's node and the start aborts when the node is absent
(src/PVE/LXC.pm, lxc-pve-autodev-hook). Real failures: remz1337/Proxmox#8 ("Failed to mount
/dev/nvidia-modeset ... Failed to run autodev hooks"), NVIDIA/enroot#15, NVIDIA/libnvidia-container#388.

So host-devices reads the devN paths of the container's main section and creates the nodes
those entries require (each with the nvidia-modprobe run that makes exactly that node), and makes
the boot files create them too (`BOOT_RUNS`); container-config adds a devN entry for an optional
node only when the boot files create it (`boot_created`), else it leaves the node out and says so.
"""

from __future__ import annotations

import re

_DEVN = re.compile(r"^dev\d+\s*[:=]\s*([^,\s]+)", re.M)

# path -> the nvidia-modprobe run that creates it (nvidia-modprobe.c: -m modeset, -c N GPU node,
# -c 255 nvidiactl; uvm: -u -c0)
RUNS = {
    "/dev/nvidia-modeset": ["nvidia-modprobe", "-m"],
    "/dev/nvidiactl": ["nvidia-modprobe", "-c255"],
    "/dev/nvidia-uvm": ["nvidia-modprobe", "-u", "-c0"],
    "/dev/nvidia-uvm-tools": ["nvidia-modprobe", "-u", "-c0"],
}


# Optional nodes gpubox can make the host create at every boot: path -> the run the udev rule adds.
BOOT_RUNS = {"/dev/nvidia-modeset": ["nvidia-modprobe", "-m"]}
_MODPROBE_RUN = re.compile(r'RUN\+="[^"]*nvidia-modprobe((?:\s+-[A-Za-z0-9]+)+)\s*"')


def boot_created(udev_rule: str) -> frozenset[str]:
    """The optional nodes a udev rule's nvidia-modprobe runs create at boot (pure): `-m` makes
    /dev/nvidia-modeset (nvidia-modprobe.c). Comment lines count for nothing."""
    out = set()
    for line in (udev_rule or "").splitlines():
        if line.lstrip().startswith("#"):
            continue
        for m in _MODPROBE_RUN.finditer(line):
            if "-m" in m.group(1).split():
                out.add("/dev/nvidia-modeset")
    return frozenset(out)


def devn_paths(conf_text: str) -> list[str]:
    """NVIDIA paths named by devN entries of the config's main section (before the first [section])."""
    main = re.split(r"^\[", conf_text or "", maxsplit=1, flags=re.M)[0]
    return [p for p in _DEVN.findall(main) if p.startswith("/dev/nvidia")]


def run_for(path: str) -> list[str] | None:
    """The nvidia-modprobe argv that creates `path`, None when gpubox does not create it."""
    if path in RUNS:
        return list(RUNS[path])
    m = re.fullmatch(r"/dev/nvidia(\d+)", path)
    return ["nvidia-modprobe", f"-c{m.group(1)}"] if m else None


def required_missing(paths: list[str], present: set[str]) -> list[tuple[str, list[str] | None]]:
    """Pure: (path, run) for each devN-required node absent on the host, in config order."""
    out, seen = [], set()
    for p in paths:
        if p not in present and p not in seen:
            seen.add(p)
            out.append((p, run_for(p)))
    return out
