"""`pct` stand-in: container status/start/stop/reboot/shutdown/config/exec/push/pull/unlock.

It reads the config the way pve-container does (main section = lines before the first `[...]`
header; `key: value`, and `lxc.* = value`) with its own small parser, independent of gpubox's,
so a gpubox parser bug cannot hide itself. On start it applies the main section's
`lxc.cgroup2.devices.allow` rules (and devN majors) to the simulated live cgroup, and bind-creates
the container's /dev nodes from `lxc.mount.entry` / `devN` with the host node's major:minor, as
LXC does. Errors use the real tool's words and exit status.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

from ..core import SimBox, StandinError

_HDR = re.compile(r"^\[[a-z][a-z0-9_\-:]+\]\s*$", re.I)
_LXC = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$")
_KEY = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")


def main_section(sim: SimBox, vmid: int) -> list[tuple[str, str]]:
    path = sim.hpath(f"/etc/pve/lxc/{vmid}.conf")
    if not path.exists():
        raise StandinError(f"Configuration file 'nodes/{sim.host}/lxc/{vmid}.conf' does not exist", 255)
    out = []
    for line in path.read_text().splitlines():
        if _HDR.match(line):
            break
        if line.startswith("#") or not line.strip():
            continue
        m = _LXC.match(line)
        if m:
            out.append((m.group(1), m.group(3)))
            continue
        m = _KEY.match(line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def _ct(st, vmid: int) -> dict:
    ct = st["containers"].get(str(vmid))
    if ct is None:
        raise StandinError(f"Configuration file 'nodes/{st['host']}/lxc/{vmid}.conf' does not exist", 255)
    return ct


def _clear_dev(sim: SimBox) -> None:
    d = sim.cpath("/dev")
    if not d.exists():
        return
    for name in os.listdir(d):
        if name.startswith("nvidia"):
            p = d / name
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _bind_node(sim: SimBox, host_path: str, ct_rel: str) -> None:
    from ..lxc import mknod

    src = sim.hpath(host_path)
    st = os.stat(src)
    mknod(sim.cpath("/" + ct_rel.strip("/")), os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))


def start(sim: SimBox, vmid: int, record_boot: bool = True, ignore_lock: bool = False) -> None:
    conf = main_section(sim, vmid)
    lock = next((v for k, v in conf if k == "lock"), None)
    with sim.state() as st:
        ct = _ct(st, vmid)
        if lock and not ignore_lock:
            raise StandinError(f"CT is locked ({lock})", 255)
        if ct["status"] == "running":
            raise StandinError(f"CT {vmid} already running", 255)
        rules, binds = [], []
        for k, v in conf:
            if k == "lxc.cgroup2.devices.allow":
                rules.append(v.strip())
            elif k == "lxc.mount.entry":
                f = v.split()
                if len(f) >= 4 and "bind" in f[3].split(","):
                    binds.append((f[0], f[1], "optional" in f[3].split(",")))
            elif re.match(r"^dev\d+$", k):
                path = v.split(",")[0].strip()
                hp = sim.hpath(path)
                if not hp.exists():  # pve-container checks devN paths before starting
                    raise StandinError(f"Device {path} does not exist", 255)
                rdev = os.stat(hp).st_rdev
                rules.append(f"c {os.major(rdev)}:{os.minor(rdev)} rwm")
                binds.append((path, path.lstrip("/"), False))
        _clear_dev(sim)
        for src, tgt, optional in binds:
            hp = sim.hpath(src)
            if not hp.exists():
                if optional:
                    continue
                raise StandinError(f"lxc-start: {vmid}: conf.c: mount_entry: 2400 No such file or directory - "
                                   f"Failed to mount \"{src}\" on \"{tgt}\"\nstartup for container '{vmid}' failed", 255)
            if hp.is_dir():
                for name in sorted(os.listdir(hp)):
                    _bind_node(sim, f"{src.rstrip('/')}/{name}", f"{tgt.rstrip('/')}/{name}")
            else:
                _bind_node(sim, src, tgt)
        ct.update(status="running", cgroup_allow=rules)
        if record_boot:
            ct["boots"] = ct.get("boots", 0) + 1


def stop(sim: SimBox, vmid: int, *, must_run: bool = False) -> None:
    lock = next((v for k, v in main_section(sim, vmid) if k == "lock"), None)
    with sim.state() as st:
        ct = _ct(st, vmid)
        if lock:
            raise StandinError(f"CT is locked ({lock})", 255)
        if ct["status"] != "running":
            if must_run:
                raise StandinError(f"CT {vmid} not running", 255)
            return
        ct.update(status="stopped", cgroup_allow=[])
        _clear_dev(sim)


def main(sim: SimBox, argv: list[str]) -> int:
    if len(argv) < 2:
        raise StandinError("400 not enough arguments\npct <command> <vmid> [OPTIONS]", 255)
    cmd, vmid_s, rest = argv[0], argv[1], argv[2:]
    if not vmid_s.isdigit():
        raise StandinError(f"400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{vmid_s}'", 255)
    vmid = int(vmid_s)
    if cmd == "status":
        with sim.state() as st:
            print(f"status: {_ct(st, vmid)['status']}")
        return 0
    if cmd == "start":
        start(sim, vmid)
        return 0
    if cmd in ("stop", "shutdown"):
        stop(sim, vmid)
        return 0
    if cmd == "reboot":
        stop(sim, vmid, must_run=True)
        start(sim, vmid)
        return 0
    if cmd == "config":
        for k, v in main_section(sim, vmid):
            print(f"{k}: {v}")
        return 0
    if cmd == "unlock":
        path = sim.hpath(f"/etc/pve/lxc/{vmid}.conf")
        lines = path.read_text().splitlines(keepends=True)
        out, in_main = [], True
        for l in lines:
            if _HDR.match(l.rstrip("\n")):
                in_main = False
            if in_main and l.startswith("lock:"):
                continue
            out.append(l)
        path.write_text("".join(out))
        return 0
    with sim.state() as st:
        running = _ct(st, vmid)["status"] == "running"
    if cmd == "exec":
        if not running:
            raise StandinError(f"container '{vmid}' not running!", 255)
        if rest[:1] == ["--"]:
            rest = rest[1:]
        if not rest:
            raise StandinError("missing command", 255)
        env = dict(os.environ, GPUBOX_SIM_SIDE="container")
        return subprocess.run(rest, env=env, stdin=sys.stdin).returncode
    if cmd in ("push", "pull"):
        if not running:
            raise StandinError(f"container '{vmid}' not running!", 255)
        if len(rest) < 2:
            raise StandinError(f"400 not enough arguments\npct {cmd} <vmid> <file> <destination>", 255)
        src, dst = rest[0], rest[1]
        if cmd == "push":
            real_src, real_dst = src, sim.cpath(dst)
        else:
            real_src, real_dst = sim.cpath(src), dst
        shutil.copyfile(real_src, real_dst)
        if "--perms" in rest:
            os.chmod(real_dst, int(rest[rest.index("--perms") + 1], 8))
        return 0
    raise StandinError(f"unknown command 'pct {cmd}'", 255)
