"""Real LXC containers for the tests and the simulated box: the kernel, not a model, says which device
nodes a container may open.

One module (about 700 lines): it is also its own entry inside a private mount namespace (`python
-m`), and the config builder must stay in step with the start that uses it.

Where the machine allows it (root, Debian's `lxc` installed, a cgroup2 hierarchy LXC can use) a Proxmox
container config is turned into an LXC config the way pve-container builds one and a real container is
started with a tiny static probe as init; otherwise `detect()` says why and callers fall back to the
pure simulation (and name it).

How a pct config becomes an LXC config, after proxmox/pve-container 94f5585 src/PVE/LXC.pm
update_lxc_config and its hooks (src/lxc-pve-prestart-hook, src/lxc-pve-autodev-hook,
src/lxc-pve-userns.conf):
- `lxc.include` of LXC's common.conf; for an unprivileged CT (`unprivileged: 1` or any `lxc.idmap`
  line) also userns.conf and the content Proxmox installs as userns.conf.d/01-pve.conf (it resets both
  device lists and allows `a`: device access becomes a deny-list), then `lxc.mount.auto = sys:mixed`;
- every devN: `lxc.cgroup2.devices.allow = <b|c> MAJ:MIN rw` (`r` plus `deny ... w` with deny-write=1),
  its node made in a passthrough dir with mode= (default 0660) and uid=/gid= mapped into the CT
  (create_passthrough_device_node), then at autodev time a regular file is made at the target (which
  fails with EEXIST when a mount entry already put something there) and the node bind-mounted over it;
- the default idmap `u/g 0 100000 65536` for an unprivileged CT without its own `lxc.idmap`;
- then every raw `lxc.*` line of the main section in file order.
What differs, on purpose: absolute mount and devN sources are read under the test's host root (fake
NVIDIA nodes made with mknod; no driver behind them, so an allowed open() gives ENXIO and a denied
one EPERM: the device cgroup is checked in may_open before chrdev_open looks for a driver); the
harness's own rootfs, init, console, log and tty lines come last so a config cannot replace them;
`lxc.net.*`, `lxc.hook.*`, `lxc.rootfs.*`, `lxc.init.*`, `lxc.console.*`, `lxc.log.*` raw lines are
dropped (listed in the answer), Proxmox mount points (mpN) and networks are not made.

On a hybrid host (cgroup v1 controllers under a tmpfs /sys/fs/cgroup) LXC would ignore every
`lxc.cgroup2.*` line, so the containers run in a private mount namespace (`unshare -m --propagation
private`) where /sys/fs/cgroup is replaced by a plain cgroup2 mount. A host that already has a
cgroup2-only /sys/fs/cgroup is left alone: a new cgroup2 mount from the initial cgroup namespace
re-applies the root flags (nsdelegate, memory_recursiveprot) to the whole machine (kernel
apply_cgroup_root_flags), so mounting it again without options would clear them system-wide.

Cleanup: every batch lives in one temp lxcpath `gpubox-lxc-<pid>-*` under the temp dir, every container
has a unique name `gpubox-<pid>-<n>`; a batch first removes the lxcpaths (and their empty cgroups)
of batches whose process is gone, so a killed run leaves nothing the next run does not clean.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpubox.safeio import pid_alive

ENV_FORCE = "GPUBOX_LXC"  # "sim": never start real containers; "real": fail when they cannot start
LXC_CONFIG = os.environ.get("GPUBOX_LXC_CONFIG", "/usr/share/lxc/config")  # lxc's own config dir
# pve-container src/lxc-pve-userns.conf, installed as userns.conf.d/01-pve.conf (Makefile).
PVE_USERNS_CONF = "lxc.cgroup2.devices.deny =\nlxc.cgroup2.devices.allow =\nlxc.cgroup2.devices.allow = a\n"
DROPPED = ("lxc.net.", "lxc.hook.", "lxc.rootfs.", "lxc.init.", "lxc.console.", "lxc.log.")
# The NVIDIA nodes every answer covers (besides the config's own devN and /dev mount targets).
NVIDIA_NODES = (
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidiactl",
    "/dev/nvidia-modeset",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2",
)
_START_TIMEOUT = 30
_MARK = "GPUBOXPROBE"

# The probe: for each path argument, lstat() it and open() it O_RDWR and O_RDONLY, print one line
# "GPUBOXPROBE path kind major minor errno_rw errno_ro". Written here (not a shell) because the verdict
# is the errno of open(2) itself; static so it runs in an empty rootfs. After the paths, `--` and a
# command: exec it (the GPU run's real cuInit).
PROBE_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int i = 1;
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    struct stat st;
    const char *k = "missing";
    unsigned ma = 0, mi = 0;
    if (lstat(argv[i], &st) == 0) {
      k = S_ISCHR(st.st_mode) ? "c" : S_ISBLK(st.st_mode) ? "b" : S_ISREG(st.st_mode) ? "file"
        : S_ISDIR(st.st_mode) ? "dir" : S_ISLNK(st.st_mode) ? "link" : "other";
      ma = major(st.st_rdev);
      mi = minor(st.st_rdev);
    }
    int e[2], fl[2] = {O_RDWR, O_RDONLY};
    for (int j = 0; j < 2; j++) {
      int fd = open(argv[i], fl[j] | O_NONBLOCK | O_NOCTTY);
      e[j] = fd < 0 ? errno : 0;
      if (fd >= 0) close(fd);
    }
    printf("GPUBOXPROBE %s %s %u %u %d %d\n", argv[i], k, ma, mi, e[0], e[1]);
  }
  fflush(stdout);
  if (i + 1 < argc) {
    execv(argv[i + 1], argv + i + 1);
    printf("GPUBOXPROBE-EXEC %d\n", errno);
    return 127;
  }
  return 0;
}
"""


@dataclass
class Runtime:
    """Which container runtime this machine gives: real LXC or the pure simulation, and why."""

    real: bool
    name: str  # "lxc 5.0.2 (real kernel, private cgroup2 namespace)" / "simulation"
    reason: str = ""  # why not real
    hybrid: bool = False  # /sys/fs/cgroup must be replaced by cgroup2 in a private namespace

    def describe(self) -> str:
        return self.name if self.real else f"{self.name} ({self.reason})"


def cgroup_layout(mountinfo: str) -> str:
    """'cgroup2' when /sys/fs/cgroup itself is a cgroup2 mount, 'hybrid' when it holds v1 mounts,
    'none' otherwise (from /proc/self/mountinfo: field 5 mount point, after ' - ' the fs type)."""
    top, v1 = None, False
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        f = pre.split()
        if len(f) < 5 or not post:
            continue
        fstype = post.split()[0]
        if f[4] == "/sys/fs/cgroup":
            top = fstype
        elif f[4].startswith("/sys/fs/cgroup/") and fstype == "cgroup":
            v1 = True
    if top == "cgroup2":
        return "cgroup2"
    return "hybrid" if v1 or top == "tmpfs" else "none"


def lxc_version() -> str:
    try:
        out = subprocess.run(["lxc-start", "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def detect() -> Runtime:
    """Real LXC when root, lxc-start, unshare and a usable cgroup2 hierarchy exist (and GPUBOX_LXC
    is not `sim`); else the simulation with the reason."""
    sim = lambda why: Runtime(False, "simulation", why)  # noqa: E731
    if os.environ.get(ENV_FORCE) == "sim":
        return sim(f"{ENV_FORCE}=sim")
    if os.geteuid() != 0:
        return sim("not root")
    for tool in ("lxc-start", "unshare", "mount", "umount"):
        if not shutil.which(tool):
            return sim(f"{tool} not installed")
    if not (shutil.which("gcc") or _cached_probe().exists()):
        return sim("no gcc to build the static probe")
    try:
        layout = cgroup_layout(Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        return sim(f"cannot read /proc/self/mountinfo: {exc.strerror}")
    if layout == "none":
        return sim("no cgroup hierarchy at /sys/fs/cgroup")
    ver = lxc_version() or "?"
    how = "private cgroup2 namespace" if layout == "hybrid" else "the host's cgroup2"
    return Runtime(True, f"lxc {ver} (real kernel, {how})", hybrid=layout == "hybrid")


_RUNTIME: Runtime | None = None


def runtime() -> Runtime:
    """detect() and one real start of an empty container, once per process (the simulated box asks
    at every `pct start`): a machine that has everything but cannot start one (no CAP_SYS_ADMIN in a
    CI container, say) gets the simulation, with LXC's reason."""
    global _RUNTIME
    if os.environ.get(ENV_FORCE) == "sim":
        return detect()
    if _RUNTIME is None:
        rt = detect()
        if rt.real:
            try:
                ans = run([Spec("arch: amd64\n", "/", probe=["/dev/null"])], rt)[0]
                if not ans["starts"]:
                    rt = Runtime(False, "simulation", "real LXC failed here: " + "; ".join(ans["error"][-2:]))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                rt = Runtime(False, "simulation", f"real LXC failed here: {exc}")
        _RUNTIME = rt
    return _RUNTIME


def _cached_probe() -> Path:
    h = hashlib.sha256(PROBE_C.encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpubox"
    return base / f"lxcprobe-{h}"


def probe_binary() -> Path:
    """The static probe, built once per source version (gcc -static; atomic rename into the cache)."""
    out = _cached_probe()
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as d:
        src = Path(d) / "probe.c"
        src.write_text(PROBE_C)
        subprocess.run(["gcc", "-static", "-O1", "-o", str(Path(d) / "probe"), str(src)], check=True)
        os.chmod(Path(d) / "probe", 0o755)
        os.replace(Path(d) / "probe", out)
    return out


# -- pct config -> LXC config -------------------------------------------------------------------

_LXC_LINE = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$", re.A)
_KEY_LINE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$", re.A)


def main_entries(text: str) -> list[tuple[str, str]]:
    """(key, value) of the main section in file order, as parse_pct_config reads them (the lines up
    to the first [section] header; `#` lines are the description)."""
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if re.match(r"^\[[^\]]+\]\s*$", line):
            break
        if not line.strip(" \t\n\v\f\r") or line.startswith("#"):
            continue
        m = _LXC_LINE.match(line) or _KEY_LINE.match(line)
        if m:
            out.append((m.group(1), m.group(m.lastindex)))
    return out


def _truthy(v: str) -> bool:
    return str(v).strip().lower() in ("1", "yes", "on", "true")


def _devn(value: str) -> dict:
    out: dict = {}
    for part in str(value).split(","):
        k, eq, v = part.partition("=")
        if not eq:
            out.setdefault("path", k.strip())
        else:
            out[k.strip()] = v.strip()
    return out


def _map_id(ct_id: int, maps: list[tuple[int, int, int]]) -> int:
    for start, host, count in maps:
        if start <= ct_id < start + count:
            return host + ct_id - start
    return 65534


class StartRefused(Exception):
    """update_lxc_config / the prestart hook died before lxc-start ran (pve's own message)."""


@dataclass
class Spec:
    """One container to start: a pct config (text), the host root its absolute paths live under,
    and the paths to probe (default: NVIDIA_NODES + the config's devN and /dev mount targets)."""

    config: str
    host_root: str
    probe: list[str] = field(default_factory=list)
    exec_after: list[str] = field(default_factory=list)  # argv run after the probe (real GPU)
    rootfs: str = ""  # "" = a fresh minimal dir; "/" = a read-only rbind of the host's /


def probe_paths(entries: list[tuple[str, str]], host_root: str) -> list[str]:
    """NVIDIA_NODES, every devN path and every mount target under dev/ (children of a directory
    source included), in a stable order."""
    out = list(NVIDIA_NODES)
    for k, v in entries:
        if re.match(r"^dev\d+$", k):
            p = _devn(v).get("path", "")
            if p.startswith("/"):
                out.append(p)
        elif k == "lxc.mount.entry":
            f = v.split()
            if len(f) < 2:
                continue
            tgt = "/" + f[1].strip("/")
            out.append(tgt)
            src = os.path.join(host_root, f[0].lstrip("/")) if f[0].startswith("/") else ""
            if src and os.path.isdir(src) and not os.path.islink(src):
                out += [f"{tgt}/{n}" for n in sorted(os.listdir(src))]
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def lxc_config(
    entries: list[tuple[str, str]], host_root: str, ctdir: Path, name: str, rootfs: str, init: list[str]
) -> tuple[str, list[str], list[tuple[str, str, int, int, int, int, int]]]:
    """(LXC config text, dropped raw lines, devN nodes to make) for one container, in
    update_lxc_config's order. Raises StartRefused where pve dies before lxc-start."""
    keys = dict(entries)
    custom_map = [v for k, v in entries if k == "lxc.idmap"]
    unpriv = _truthy(keys.get("unprivileged", "0")) or bool(custom_map)
    raw = [f"lxc.include = {LXC_CONFIG}/common.conf"]
    raw.append(f"lxc.hook.autodev = {ctdir / 'autodev'}")
    if unpriv:
        raw.append(f"lxc.include = {LXC_CONFIG}/userns.conf")
        raw += PVE_USERNS_CONF.strip().split("\n")
        raw.append("lxc.mount.auto = sys:mixed")
    maps: dict[str, list[tuple[int, int, int]]] = {"u": [], "g": []}
    for t, first, host, count in _idmaps(entries):
        maps[t].append((first, host, count))
    devs = []
    for key in sorted((k for k in keys if re.match(r"^dev\d+$", k)), key=lambda k: int(k[3:])):
        d = _devn(keys[key])
        path = d.get("path")
        if not path:
            raise StartRefused(f"Path is not defined for passthrough device {key}")
        try:
            st = os.stat(os.path.join(host_root, path.lstrip("/")))
        except FileNotFoundError:
            raise StartRefused(f"Device {path} does not exist") from None
        except OSError:
            raise StartRefused(f"Error accessing device {path}") from None
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise StartRefused(f"{path} is not a device")
        t = "b" if stat.S_ISBLK(st.st_mode) else "c"
        ma, mi = os.major(st.st_rdev), os.minor(st.st_rdev)
        deny_write = _truthy(d.get("deny-write", "0"))
        raw.append(f"lxc.cgroup2.devices.allow = {t} {ma}:{mi} {'r' if deny_write else 'rw'}")
        if deny_write:
            raw.append(f"lxc.cgroup2.devices.deny = {t} {ma}:{mi} w")
        uid, gid = int(d.get("uid", 0) or 0), int(d.get("gid", 0) or 0)
        if unpriv:
            uid, gid = _map_id(uid, maps["u"]), _map_id(gid, maps["g"])
        devs.append((path, t, ma, mi, int(d.get("mode", "0660"), 8), uid, gid))
    raw.append("lxc.monitor.unshare = 1")
    if unpriv and not custom_map:
        raw += ["lxc.idmap = u 0 100000 65536", "lxc.idmap = g 0 100000 65536"]
    raw.append(f"lxc.uts.name = {name}")
    dropped = []
    for k, v in entries:
        if not k.startswith("lxc."):
            continue
        if k.startswith(DROPPED):
            dropped.append(f"{k}: {v}")
            continue
        if k == "lxc.mount.entry" or (k == "lxc.cgroup2.devices.allow" and v.startswith("/")):
            v = _host_source(v, host_root)  # a devpath rule is stat()ed on the host: under its root too
        elif k == "lxc.include" and v.startswith("/") and os.path.lexists(os.path.join(host_root, v[1:])):
            v = os.path.join(host_root, v[1:])  # the host's own include file
        raw.append(f"{k} = {v}")
    raw += [
        "lxc.autodev = 1",
        "lxc.tty.max = 0",
        "lxc.console.path = none",
        f"lxc.log.file = {ctdir / 'log'}",
        "lxc.log.level = WARN",
    ]
    if rootfs == "/":
        raw += ["lxc.rootfs.path = dir:/", "lxc.rootfs.options = ro"]
    else:
        raw.append(f"lxc.rootfs.path = dir:{ctdir / 'rootfs'}")
    raw.append("lxc.init.cmd = " + " ".join(init))
    return "\n".join(raw) + "\n", dropped, devs


def _host_source(value: str, host_root: str) -> str:
    """A mount entry with its absolute source read under the host root (a relative source and
    non-path sources such as `tmpfs` stay as written: LXC uses them as they are)."""
    f = value.split(None, 1)
    if len(f) == 2 and f[0].startswith("/") and host_root not in ("", "/"):
        return os.path.join(host_root, f[0].lstrip("/")) + " " + f[1]
    return value


def _autodev_script(ctdir: Path, devs) -> str:
    """lxc-pve-autodev-hook's passthrough part: a regular file at the target (EEXIST when something
    is there already: the start fails), then the passthrough node bind-mounted over it."""
    lines = ["#!/bin/sh", "set -e", f"exec 2>>{ctdir / 'hook.err'}", 'R="$LXC_ROOTFS_MOUNT"']
    for path, *_ in devs:
        rel = path[len("/dev/") :] if path.startswith("/dev/") else path.lstrip("/")
        t = f'"$R/dev/{rel}"'
        lines += [
            f'mkdir -p "$(dirname {t})"',
            f'if [ -e {t} ] || [ -L {t} ]; then echo "Could not mknod $R/dev/{rel}: File exists" >&2; '
            "exit 1; fi",
            f": > {t}",
            f"mount --bind {ctdir / 'passthrough' / rel} {t}",
        ]
    return "\n".join(lines) + "\n"


# -- answers ------------------------------------------------------------------------------------


def verdict(kind: str, e_rw: int, e_ro: int) -> str:
    """One word for what the container got at a path: absent | file | dir | link | other for what
    is no device; for a device node rw (open O_RDWR passes the device cgroup: 0 with a driver,
    ENXIO on a fake node, ENODEV where a real driver of that major has no such minor: any errno but
    EPERM/EACCES comes from past the cgroup check), ro (only O_RDONLY passes), denied (EPERM both
    ways), mode (EACCES: the file mode / idmap refused before the cgroup was asked)."""
    if kind == "missing":
        return "absent"
    if kind not in ("c", "b"):
        return kind
    refused = (errno.EPERM, errno.EACCES)
    if e_rw not in refused:
        return "rw"
    if e_rw == errno.EACCES:
        return "mode"
    if e_ro not in refused:
        return "ro"
    return "denied"


def cuda_standin(nodes: dict[str, dict]) -> int:
    """cuInit's answer as the node opens predict it (the stand-in where no GPU exists): 100
    (CUDA_ERROR_NO_DEVICE) when nvidiactl or nvidia0 cannot be opened read-write, 999
    (CUDA_ERROR_UNKNOWN) when /dev/nvidia-uvm cannot (denied, absent, or an empty file), else 0."""
    v = lambda p: (nodes.get(p) or {}).get("verdict")  # noqa: E731
    if v("/dev/nvidiactl") != "rw" or v("/dev/nvidia0") != "rw":
        return 100
    return 0 if v("/dev/nvidia-uvm") == "rw" else 999


def parse_probe(stdout: str) -> tuple[dict[str, dict], list[str]]:
    """The probe's lines -> {path: {kind, rdev, errno_rw, errno_ro, verdict}}, other output lines."""
    nodes, other = {}, []
    for line in stdout.splitlines():
        f = line.split()
        if len(f) == 7 and f[0] == _MARK:
            e_rw, e_ro = int(f[5]), int(f[6])
            nodes[f[1]] = {
                "kind": f[2],
                "rdev": [int(f[3]), int(f[4])] if f[2] in ("c", "b") else None,
                "errno_rw": errno.errorcode.get(e_rw, str(e_rw)) if e_rw else "0",
                "errno_ro": errno.errorcode.get(e_ro, str(e_ro)) if e_ro else "0",
                "verdict": verdict(f[2], e_rw, e_ro),
            }
        else:
            other.append(line)
    return nodes, other


# -- running a batch ----------------------------------------------------------------------------


def clean_stale(tmp: str | None = None) -> list[str]:
    """Remove the lxcpaths of batches whose process is gone (a killed run) and their empty cgroups."""
    tmp = tmp or tempfile.gettempdir()
    gone = []
    for p in Path(tmp).glob("gpubox-lxc-*"):
        m = re.match(r"^gpubox-lxc-(\d+)-", p.name)
        if not m or pid_alive(int(m.group(1))):
            continue
        for ct in p.iterdir() if p.is_dir() else ():
            subprocess.run(
                ["lxc-stop", "-k", "-n", ct.name, "-P", str(p)], capture_output=True, timeout=30, check=False
            )
            _umount_under(ct)
        shutil.rmtree(p, ignore_errors=True)
        gone.append(str(p))
    return gone


def _umount_under(path: Path) -> None:
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    for line in reversed(mounts):
        f = line.split()
        if len(f) > 4 and (f[4] == str(path) or f[4].startswith(str(path) + "/")):
            subprocess.run(["umount", "-l", f[4]], capture_output=True, check=False)


def _rm_cgroups(mine: str) -> None:
    """rmdir LXC's payload/monitor cgroups of this batch (`mine`: its name prefix) and of batches
    whose process is gone (left by a killed lxc-start); a cgroup with processes stays (EBUSY)."""
    root = Path("/sys/fs/cgroup")
    for d in sorted(root.glob("lxc.*.gpubox-*"), reverse=True):
        m = re.match(r"^lxc\.[a-z]+\.gpubox-(\d+)-", d.name)
        if not (d.name.split(".", 2)[-1].startswith(mine) or (m and not pid_alive(int(m.group(1))))):
            continue
        for sub in sorted((x for x in d.rglob("*") if x.is_dir()), key=lambda x: -len(x.parts)):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            d.rmdir()
        except OSError:
            pass


def run(specs: list[Spec], runtime: Runtime | None = None) -> list[dict]:
    """Start every spec as a real container, one after the other, all in one private namespace;
    one answer dict per spec (see _start_one)."""
    runtime = runtime or detect()
    if not runtime.real:
        raise RuntimeError(f"no real LXC here: {runtime.reason}")
    clean_stale()
    probe = probe_binary()
    base = Path(tempfile.mkdtemp(prefix=f"gpubox-lxc-{os.getpid()}-"))
    try:
        os.chmod(base, 0o755)
        job = {"base": str(base), "probe": str(probe), "hybrid": runtime.hybrid, "specs": []}
        job["prefix"] = f"gpubox-{os.getpid()}-"
        for i, s in enumerate(specs):
            job["specs"].append(
                {
                    "name": f"gpubox-{os.getpid()}-{i}",
                    "config": s.config,
                    "host_root": s.host_root,
                    "probe": s.probe,
                    "exec_after": s.exec_after,
                    "rootfs": s.rootfs,
                }
            )
        (base / "job.json").write_text(json.dumps(job))
        argv = ["unshare", "-m", "--propagation", "private", "--", sys.executable, "-m", __name__]
        argv += ["--inside", str(base / "job.json")]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60 + _START_TIMEOUT * len(specs))
        out = base / "answers.json"
        if not out.exists():
            raise RuntimeError(f"real LXC batch gave no answers: {res.stderr.strip()[-2000:]}")
        answers = json.loads(out.read_text())
        for a in answers:
            a["runtime"] = runtime.name
        return answers
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _inside(job_path: str) -> int:
    """In the private mount namespace: cgroup2 at /sys/fs/cgroup where the host is hybrid, then
    each container in turn; answers.json next to the job."""
    job = json.loads(Path(job_path).read_text())
    if job["hybrid"]:
        subprocess.run(["umount", "-R", "/sys/fs/cgroup"], check=True)
        subprocess.run(["mount", "-t", "cgroup2", "cgroup2", "/sys/fs/cgroup"], check=True)
    _rm_cgroups(job["prefix"])
    _grant_subids(Path(job["base"]), [main_entries(s["config"]) for s in job["specs"]])
    answers = []
    try:
        for s in job["specs"]:
            answers.append(_start_one(Path(job["base"]), job["probe"], s))
    finally:
        _rm_cgroups(job["prefix"])
        (Path(job["base"]) / "answers.json").write_text(json.dumps(answers))
    return 0


def _idmaps(entries: list[tuple[str, str]]) -> list[tuple[str, int, int, int]]:
    """(u|g, first container id, first host id, count) of every id range an unprivileged container
    maps: its own `lxc.idmap` lines, or pve's default u/g 0 100000 65536; none when privileged."""
    custom = [v for k, v in entries if k == "lxc.idmap"]
    if not custom and not _truthy(dict(entries).get("unprivileged", "0")):
        return []
    out = []
    for v in custom or ["u 0 100000 65536", "g 0 100000 65536"]:
        f = v.split()
        if len(f) == 4 and f[0] in "ugb" and all(x.isdigit() for x in f[1:]):
            for t in ("u", "g") if f[0] == "b" else (f[0],):
                out.append((t, int(f[1]), int(f[2]), int(f[3])))
    return out


def _grant_subids(base: Path, batch: list[list[tuple[str, str]]]) -> None:
    """Give root the subordinate id ranges the batch maps, in this private mount namespace only.

    Where newuidmap/newgidmap are installed (Debian's `uidmap`, one of lxc's Recommends), LXC maps
    ids through them even as root (lxc src/lxc/conf.c lxc_map_ids), and they refuse a range that
    /etc/subuid and /etc/subgid do not grant to root. A Proxmox host has `root:100000:65536` there
    (pve-manager's postinst); a plain Debian machine has nothing. The lines go into a tmpfs-backed
    overlay of /etc that exists only in this namespace: the machine's own /etc is never written."""
    ranges = {(t, host, count) for e in batch for t, _, host, count in _idmaps(e)}
    if not ranges or not (shutil.which("newuidmap") and shutil.which("newgidmap")):
        return
    layer = base / "etc-layer"
    layer.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "gpubox-etc", str(layer)], check=True)
    upper, work = layer / "upper", layer / "work"
    upper.mkdir()
    work.mkdir()
    for t, name in (("u", "subuid"), ("g", "subgid")):
        try:
            have = Path("/etc", name).read_text()
        except OSError:
            have = ""
        lines = [f"root:{first}:{count}" for tt, first, count in sorted(ranges) if tt == t]
        (upper / name).write_text(
            have + ("" if not have or have.endswith("\n") else "\n") + "\n".join(lines) + "\n"
        )
        os.chmod(upper / name, 0o644)
    opts = f"lowerdir=/etc,upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "gpubox-etc", "-o", opts, "/etc"], check=True)


def _start_one(base: Path, probe: str, s: dict) -> dict:
    """One real start: {starts, error (the start's ERROR log lines / pve's message), nodes, cuinit,
    dropped, lxc_config}."""
    name, host_root = s["name"], s["host_root"]
    ctdir = base / name
    (ctdir / "passthrough").mkdir(parents=True)
    entries = main_entries(s["config"])
    paths = s["probe"] or probe_paths(entries, host_root)
    init = ["/probe", *paths]
    if s["rootfs"] == "/":
        init = [str(probe), *paths]
    if s["exec_after"]:
        init += ["--", *s["exec_after"]]
    ans: dict = {"name": name, "probe": paths}
    try:
        conf, dropped, devs = lxc_config(entries, host_root, ctdir, name, s["rootfs"], init)
    except StartRefused as exc:
        ans.update(starts=False, error=[str(exc)], nodes={}, cuinit=None, dropped=[], lxc_config="")
        return ans
    for path, t, ma, mi, mode, uid, gid in devs:  # prestart hook: create_passthrough_device_node
        p = ctdir / "passthrough" / path.lstrip("/").removeprefix("dev/")
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(p, (stat.S_IFBLK if t == "b" else stat.S_IFCHR) | 0o600, os.makedev(ma, mi))
        os.chmod(p, mode)
        os.chown(p, uid, gid)
    (ctdir / "hook.err").touch()
    os.chmod(ctdir / "hook.err", 0o666)  # the hook of an unprivileged CT runs as its mapped root
    (ctdir / "autodev").write_text(_autodev_script(ctdir, devs))
    os.chmod(ctdir / "autodev", 0o755)
    if s["rootfs"] != "/":
        for d in ("dev", "proc", "sys"):
            (ctdir / "rootfs" / d).mkdir(parents=True)
        shutil.copy(probe, ctdir / "rootfs" / "probe")
        os.chmod(ctdir / "rootfs" / "probe", 0o755)
    os.chmod(ctdir, 0o755)
    (ctdir / "config").write_text(conf)
    try:
        r = subprocess.run(
            ["lxc-start", "-F", "-n", name, "-P", str(base)],
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT,
        )
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as exc:
        subprocess.run(["lxc-stop", "-k", "-n", name, "-P", str(base)], capture_output=True, check=False)
        rc, stdout, stderr = 124, (exc.stdout or b"").decode(errors="replace") if exc.stdout else "", ""
    log = (ctdir / "log").read_text(errors="replace") if (ctdir / "log").exists() else ""
    nodes, other = parse_probe(stdout)
    errors = [_log_msg(x) for x in log.splitlines() if " ERROR " in x]
    hook = ctdir / "hook.err"
    if hook.exists():  # the autodev hook's own message comes first, as pve's task log shows it
        errors = [x for x in hook.read_text(errors="replace").splitlines() if x.strip()] + errors
    warnings = [_log_msg(x) for x in log.splitlines() if " WARN " in x and "Inherited fd" not in x]
    if not errors:  # LXC stopped before its log was set up (a config it cannot load): its stderr
        errors = [re.sub(r"^lxc-start: \S+: ", "", x) for x in stderr.splitlines() if x.strip()]
    started = _MARK in stdout
    ans.update(
        starts=started,
        rc=rc,
        error=[] if started else errors,
        warnings=warnings,
        nodes=nodes,
        cuinit=cuda_standin(nodes) if started else None,
        output=other,
        stderr=stderr,
        dropped=dropped,
        lxc_config=conf,
    )
    return ans


def _log_msg(line: str) -> str:
    """An LXC log line without its 'lxc-start <name> <timestamp>' prefix."""
    m = re.match(r"^\S+ \S+ \d+\.\d+ (.*)$", line)
    return m.group(1) if m else line


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inside":
        sys.exit(_inside(sys.argv[2]))
    sys.exit(2)
