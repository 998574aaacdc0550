"""`nvidia-modprobe` stand-in: `-u` loads nvidia-uvm (adds its /proc/devices line with the major
the kernel hands out) and creates /dev/nvidia-uvm (minor 0) and -tools (minor 1); `-c N` creates
/dev/nvidiaN (195:N) and /dev/nvidiactl. Like the real tool, an existing node with the wrong
major:minor is replaced."""

from __future__ import annotations

import os

from ..core import SimBox, StandinError


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


def main(sim: SimBox, argv: list[str]) -> int:
    uvm, minors = False, []
    it = iter(argv)
    for a in it:
        if a in ("-u", "--unified-memory"):
            uvm = True
        elif a.startswith("-c"):
            v = a[2:] or next(it, "")
            if not v.isdigit():
                raise StandinError(f"nvidia-modprobe: invalid minor number '{v}'", 1)
            minors.append(int(v))
        elif a in ("-m", "--modeset", "-s", "--silent"):
            pass
        else:
            raise StandinError(f"nvidia-modprobe: unrecognized option: \"{a}\"", 1)
    pd = sim.hpath("/proc/devices")
    majors = _char_majors(pd.read_text())
    if not any(n in majors for n in ("nvidia-frontend", "nvidia", "nvidiactl")):
        raise StandinError("", 1)  # the real tool fails silently when nvidia.ko cannot load
    for m in minors:
        _ensure(sim, f"/dev/nvidia{m}", 195, m)
    if minors:
        _ensure(sim, "/dev/nvidiactl", 195, 255)
    if uvm:
        if "nvidia-uvm" not in majors:
            major = sim.read_state().get("lxc", {}).get("uvm_major", 511)
            text = pd.read_text()
            head, sep, tail = text.partition("\n\nBlock devices:")
            pd.write_text(f"{head}\n{major:3d} nvidia-uvm{sep}{tail}")
            majors["nvidia-uvm"] = major
        _ensure(sim, "/dev/nvidia-uvm", majors["nvidia-uvm"], 0)
        _ensure(sim, "/dev/nvidia-uvm-tools", majors["nvidia-uvm"], 1)
    return 0
