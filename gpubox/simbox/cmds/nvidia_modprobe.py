"""`nvidia-modprobe` stand-in, following NVIDIA/nvidia-modprobe a9556df (nvidia-modprobe.c main,
option-table.h, modprobe-utils/nvidia-modprobe-utils.c):

- no -u: load nvidia.ko; each `-c N` creates /dev/nvidiaN 195:N (N = 255 is /dev/nvidiactl).
- `-u`: load nvidia-uvm (its /proc/devices line appears with the major the kernel hands out);
  each `-c N` is a *uvm base minor*: nvidia_uvm_mknod(N) creates /dev/nvidia-uvm UVM:N and
  /dev/nvidia-uvm-tools UVM:N+1. So `-u -c0 -c1` really leaves /dev/nvidia-uvm at minor 1.
- `-m`: nvidia-modeset and /dev/nvidia-modeset 195:254.
- mknod_helper replaces a node with the wrong type or major:minor (mode 0666, root:root).
- It prints nothing on failure unless told, and exits 1 (main returns !ret). A bad command line
  gets nvgetopt's line (common-utils/nvgetopt.c) then main's nv_error_msg (exit 1).
"""

from __future__ import annotations

import os

from ..core import SimBox, StandinError

_BAD = "\nERROR: Invalid commandline, please run `nvidia-modprobe --help` for usage information.\n"
_LONG = {
    "--unified-memory": "-u",
    "--modeset": "-m",
    "--nvswitch": "-s",
    "--nvlink": "-l",
    "--auto-online-movable": "-a",
    "--create-nvidia-device-file": "-c",
    "--nvidia-capability-device-file": "-f",
}


def _char_majors(text: str) -> dict[str, int]:
    out, in_char = {}, False
    for line in text.splitlines():
        s = line.strip()
        if s.endswith(":"):
            in_char = s == "Character devices:"
        elif in_char and s:
            m, n = s.split(None, 1)
            out.setdefault(n, int(m))
    return out


def _ensure(sim: SimBox, path: str, major: int, minor: int) -> None:
    from ..lxc import mknod

    p = sim.hpath(path)
    if p.exists():
        st = os.stat(p)
        if (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor):
            return
    mknod(p, major, minor, 0o666)


def _parse(argv: list[str]) -> tuple[set[str], list[int]]:
    flags, minors = set(), []
    it = iter(argv)
    for a in it:
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            short = _LONG.get(name)
            if short is None:
                raise StandinError(f'nvidia-modprobe: unrecognized option: "{a}"\n{_BAD}', 1)
            a = short + val if eq else short
        if a.startswith("-c") or a.startswith("-f"):
            v = a[2:] or next(it, "")
            if a.startswith("-f"):
                continue
            try:  # nvgetopt's integer argument (strtol base 0)
                minors.append(int(v, 0))
            except ValueError:
                raise StandinError(
                    f'nvidia-modprobe: "{v}" is not a valid argument for option "{a[:2]}".\n{_BAD}', 1
                ) from None
        elif a in ("-u", "-m", "-s", "-l", "-a"):
            flags.add(a)
        elif a in ("-v", "-h", "--version", "--help"):
            flags.add("-h")
        else:
            raise StandinError(f'nvidia-modprobe: unrecognized option: "{a}"\n{_BAD}', 1)
    return flags, minors


def main(sim: SimBox, argv: list[str]) -> int:
    flags, minors = _parse(argv)
    if "-h" in flags:
        print("nvidia-modprobe:  version 580.95.05 (simulated)")
        return 0
    pd = sim.hpath("/proc/devices")
    majors = _char_majors(pd.read_text())
    if not any(n in majors for n in ("nvidia-frontend", "nvidia", "nvidiactl")):
        raise StandinError("", 1)  # modprobe of nvidia.ko failed: silent, exit 1
    if "-u" in flags:
        if "nvidia-uvm" not in majors:
            major = sim.read_state().get("lxc", {}).get("uvm_major", 511)
            text = pd.read_text()
            head, sep, tail = text.partition("\n\nBlock devices:")
            pd.write_text(f"{head}\n{major:3d} nvidia-uvm{sep}{tail}")
            majors["nvidia-uvm"] = major
        for m in minors:  # nvidia_uvm_mknod(base_minor)
            _ensure(sim, "/dev/nvidia-uvm", majors["nvidia-uvm"], m)
            _ensure(sim, "/dev/nvidia-uvm-tools", majors["nvidia-uvm"], m + 1)
    elif not flags & {"-s", "-l", "-a"}:
        for m in minors:  # nvidia_mknod(minor); assign_device_file_name: 255 -> nvidiactl
            if not 0 <= m <= 255:
                raise StandinError("", 1)
            _ensure(sim, "/dev/nvidiactl" if m == 255 else f"/dev/nvidia{m}", 195, m)
    if "-m" in flags:
        _ensure(sim, "/dev/nvidia-modeset", 195, 254)
    return 0
