"""`pct` stand-in: status/start/stop/shutdown/reboot/set/config/exec/push/pull/unlock, as pve-container does them.

One module (about 770 lines): it is the one `pct` command, each verb next to the Proxmox source it
follows.

Checked against proxmox/pve-container 94f5585 (src/PVE/CLI/pct.pm, src/PVE/API2/LXC/Status.pm,
src/PVE/LXC.pm, src/PVE/LXC/Config.pm, src/PVE/LXC/Tools.pm, src/lxc-pve-prestart-hook),
proxmox/pve-guest-common 4a8f6cb (src/PVE/AbstractConfig.pm) and proxmox/pve-common f665029
(src/PVE/RESTEnvironment.pm, src/PVE/CLIHandler.pm, src/PVE/File.pm, src/PVE/UPID.pm):

- The config is parsed like parse_pct_config (own small parser, independent of gpubox's, so a
  gpubox parser bug cannot hide itself) and written back like write_pct_config: every Proxmox
  write re-renders the whole file (description `#` lines, keys sorted, `lxc.*` as `key: value`,
  then [pve:pending], then snapshots sorted by name).
- Where an error happens decides how it shows (RESTEnvironment fork_worker with type 'cli'):
  checks before the worker ("CT 200 already running", "CT 200 not running", "container '200' not
  running!") die straight out of pct: message on stderr, exit 255. Errors inside the worker
  ("CT is locked (backup)", "Device /dev/X does not exist", "startup for container '200' failed")
  are printed on stderr by tee_worker; start/stop/shutdown/reboot then exit 255 through
  $upid_exit, while push/pull have no $upid_exit and exit 0 even when their worker failed.
- `pct start` applies a [pve:pending] section first (LXC.pm vm_start -> vmconfig_apply_pending +
  write_config). devN entries: update_lxc_config stats the host node at every start
  (Tools.pm get_device_mode_and_rdev, "Device $path does not exist") and adds
  `lxc.cgroup2.devices.allow = c MAJ:MIN rw` (`r` with deny-write); the container node gets
  mode= (default 0660), uid=/gid= (default 0). lxc.mount.entry binds copy the host node.
- A start failure inside lxc-start prints the container's stderr log, then
  "startup for container '<vmid>' failed" (LXC.pm monitor_start).
- vm_start's order (LXC.pm): pending applied, update_lxc_config writes /var/lib/lxc/<vmid>/config,
  the hookscript `<script> <vmid> pre-start` (GuestHelpers exec_hookscript with stop_on_error: a
  non-zero exit dies "hookscript error for <vmid> on pre-start: ..."), the start (from the config
  as it was read before the hook: an edit in pre-start reaches only the next start), then
  `<script> <vmid> post-start` (an error there is only a warning), all of it under lock_config
  (API2/LXC/Status.pm vm_start: a hook's own config write waits for the start to end). `pct set --hookscript` checks
  the volume exists and is executable (GuestHelpers check_hookscript).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable
from urllib.parse import quote, unquote

from ..core import SimBox, StandinError
from ..devnodes import mknod

PCT_PM = "/usr/share/perl5/PVE/CLI/pct.pm"  # where a Perl `die` without "\n" says it died
# re.A: Config.pm matches bytes, so \s, \d and [a-z]/i are ASCII there
_HDR_PENDING = re.compile(r"^\[pve:pending\]\s*$", re.I | re.A)
_HDR_SNAP = re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.I | re.A)
_LXC = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$", re.A)
_KEY = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$", re.A)
# A few typed keys of Config.pm's $confdesc: check_type turns their values into 0/1 / integers,
# which is what a rewrite then stores (the rest are strings and stay as written).
_BOOL = {"onboot", "unprivileged", "template", "console", "protection", "debug"}
_INT = {"cores", "memory", "swap", "cpuunits", "tty", "startup_delay"}
_TASK_FAIL = 255  # exit(-1) in $upid_exit, and Perl's exit status for an uncaught die


class PreTaskError(StandinError):
    """Raised before any worker starts: pct dies with it (exit 255); the API answers HTTP 500."""

    def __init__(self, msg: str):
        super().__init__(msg, _TASK_FAIL)


Warn = Callable[[str], None]


# -- config file: parse_pct_config / write_pct_config ------------------------------------------


def _typed(key: str, value: str):
    if key in _BOOL:
        if value == "1" or value.lower() in ("on", "yes", "true"):
            return 1
        if value == "0" or value.lower() in ("off", "no", "false"):
            return 0
    if key in _INT and value.isdigit():
        return int(value)
    return value


def parse_config(raw: str, vmid: int, warn: Warn | None = None) -> dict:
    """parse_pct_config (non-strict): main keys, 'lxc' pairs, 'description', 'pending', 'snapshots'."""
    import hashlib

    warn = warn or (lambda m: None)
    res: dict = {"digest": hashlib.sha1(raw.encode()).hexdigest(), "snapshots": {}, "pending": {}}
    conf, descr = res, ""
    for line in raw.split("\n"):
        if not line.strip(" \t\n\v\f\r"):  # m/^\s*$/ on bytes
            continue
        m = _HDR_SNAP.match(line)
        if _HDR_PENDING.match(line) or m:
            if descr:
                conf["description"] = descr
            descr = ""
            if m:
                conf = res["snapshots"][m.group(1)] = {}
            else:
                conf = res["pending"] = {}
            continue
        if line.startswith("#"):
            descr += unquote(line[1:]) + "\n"
            continue
        m = _LXC.match(line)
        if m:
            key, value = m.group(1), m.group(3)
            if key.startswith("lxc.cgroup."):  # Config.pm is_valid_lxc_conf_key (pve-container 6026000)
                warn(f"vm {vmid} - {key} is deprecated, this will be a hard error in the future!")
            conf.setdefault("lxc", []).append([key, value])
            continue
        m = re.match(r"^(description):\s*(.*\S)\s*$", line, re.A)
        if m:
            descr += unquote(m.group(2))
            continue
        m = _KEY.match(line)
        if m:
            conf[m.group(1)] = _typed(m.group(1), m.group(2))
            continue
        warn(f"vm {vmid} - unable to parse config: {line}")
    if descr:
        conf["description"] = descr
    return res


def _encode_text(text: str) -> str:
    """PVE::ParseUtils::encode_text: escape control/hi-bit characters, ':' and '%'."""
    return quote(text, safe="".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in ":%"))


def _raw_section(conf: dict) -> str:
    raw = "".join(f"#{_encode_text(cl)}\n" for cl in (conf.get("description") or "").split("\n") if cl)
    skip = {"digest", "description", "pending", "snapshots", "snapname", "env", "lxc"}
    for key in sorted(k for k in conf if k not in skip):
        raw += f"{key}: {conf[key]}\n"
    for k, v in conf.get("lxc", []):
        raw += f"{k}: {v}\n"
    return raw


def render_config(conf: dict) -> str:
    """write_pct_config."""
    raw = _raw_section(conf)
    if conf.get("pending"):
        raw += "\n[pve:pending]\n" + _raw_section(conf["pending"])
    for name in sorted(conf.get("snapshots", {})):
        raw += f"\n[{name}]\n" + _raw_section(conf["snapshots"][name])
    return raw


def _conf_file(sim: SimBox, vmid: int):
    return sim.hpath(f"/etc/pve/lxc/{vmid}.conf")


def load_config(sim: SimBox, vmid: int, warn: Warn | None = None) -> dict:
    path = _conf_file(sim, vmid)
    if not path.exists():  # AbstractConfig load_config
        raise StandinError(
            f"Configuration file 'nodes/{sim.host}/lxc/{vmid}.conf' does not exist", _TASK_FAIL
        )
    return parse_config(path.read_text(), vmid, warn)


def write_config(sim: SimBox, vmid: int, conf: dict) -> None:
    """cfs_write_file (pve-cluster src/PVE/Cluster.pm): `<file>.tmp.<pid>`, then rename(), through
    the simulated pmxcfs: without quorum the open fails, "unable to open file '<tmp>' - Permission
    denied", exit 255."""
    from ..pmxcfs import PmxcfsOps

    ops = PmxcfsOps(sim.host_root)
    path = str(_conf_file(sim, vmid))
    tmp = f"{path}.tmp.{os.getpid()}"
    shown = f"/etc/pve/nodes/{sim.host}/lxc/{vmid}.conf.tmp.{os.getpid()}"
    try:
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    except OSError as exc:
        raise StandinError(f"unable to open file '{shown}' - {exc.strerror}", 255) from None
    try:
        ops.write(fd, render_config(conf).encode())
    finally:
        ops.close(fd)
    ops.replace(tmp, path)


def current_config(conf: dict) -> dict:
    """AbstractConfig load_current_config(current=0): pending values taken in, pending deletes done."""
    out = {k: v for k, v in conf.items() if k not in ("pending", "snapshots")}
    pend = conf.get("pending", {})
    for k, v in pend.items():
        if k != "delete":
            out[k] = v
    for k in _pending_deletes(pend):
        out.pop(k, None)
    return out


def _pending_deletes(pend: dict) -> list[str]:
    return [d.lstrip("!") for d in re.split(r"[,;\s]+", str(pend.get("delete", ""))) if d.strip()]


# -- container state ---------------------------------------------------------------------------


def _ct(st, vmid: int) -> dict:
    ct = st["containers"].get(str(vmid))
    if ct is None:
        raise StandinError(
            f"Configuration file 'nodes/{st['host']}/lxc/{vmid}.conf' does not exist", _TASK_FAIL
        )
    return ct


def is_running(sim: SimBox, vmid: int) -> bool:
    return (sim.read_state()["containers"].get(str(vmid)) or {}).get("status") == "running"


def _clear_dev(sim: SimBox) -> None:
    d = sim.cpath("/dev")
    if not d.exists():
        return
    for name in os.listdir(d):
        if name.startswith("nvidia"):
            p = d / name
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _bind_node(sim: SimBox, host_path: str, ct_rel: str) -> None:
    st = os.stat(sim.hpath(host_path))
    mknod(
        sim.cpath("/" + ct_rel.strip("/")),
        os.major(st.st_rdev),
        os.minor(st.st_rdev),
        stat.S_IMODE(st.st_mode),
    )


def _parse_dev(value: str) -> dict:
    """devN property string: `[path=]/dev/x[,gid=..][,mode=0666][,uid=..][,deny-write=1]`."""
    out: dict = {}
    for part in str(value).split(","):
        k, eq, v = part.partition("=")
        if not eq:
            out["path"] = k.strip()
        else:
            out[k.strip()] = v.strip()
    return out


def _check_lock(conf: dict) -> None:
    if conf.get("lock"):  # AbstractConfig check_lock: guest_type() . " is locked ($conf->{lock})"
        raise StandinError(f"CT is locked ({conf['lock']})", _TASK_FAIL)


def _vm_start(sim: SimBox, vmid: int, conf: dict, *, hook_checks_lock: bool = False) -> tuple[list, list]:
    """LXC.pm vm_start up to lxc-start: apply pending, then update_lxc_config's devN handling."""
    if conf.get("pending"):
        for k in _pending_deletes(conf["pending"]):
            conf.pop(k, None)
        for k, v in conf["pending"].items():
            if k != "delete":
                conf[k] = v
        conf["pending"] = {}
        write_config(sim, vmid, conf)
    rules, devs = [], []
    for key in sorted((k for k in conf if re.match(r"^dev\d+$", k)), key=lambda k: int(k[3:])):
        dev = _parse_dev(conf[key])
        path = dev.get("path")
        if not path:
            raise StandinError(f"Path is not defined for passthrough device {key}", _TASK_FAIL)
        hp = sim.hpath(path)
        if not os.path.lexists(hp):  # Tools.pm get_device_mode_and_rdev
            raise StandinError(f"Device {path} does not exist", _TASK_FAIL)
        st = os.stat(hp)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise StandinError(f"{path} is not a device", _TASK_FAIL)
        kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
        ma, mi = os.major(st.st_rdev), os.minor(st.st_rdev)
        deny = str(dev.get("deny-write", "0")).lower() in ("1", "yes", "on", "true")
        rules.append(f"{kind} {ma}:{mi} {'r' if deny else 'rw'}")
        devs.append(
            (path, ma, mi, int(dev.get("mode", "0660"), 8), int(dev.get("uid", 0)), int(dev.get("gid", 0)))
        )
    if hook_checks_lock and conf.get("lock"):  # lxc-pve-prestart-hook: check_lock unless skiplock
        raise StandinError(
            f"CT is locked ({conf['lock']})\nstartup for container '{vmid}' failed", _TASK_FAIL
        )
    return rules, devs


def _refuse_like_lxc(sim: SimBox, vmid: int, conf: dict) -> list[str]:
    """Fail where the real start fails, from the one start model (provision.lxcmodel, written from
    lxc cgfsng.c / cgroup2_devices.c and lxc-pve-autodev-hook): an unparsable device rule, a devN node
    that a mount entry already put in place (EEXIST). Lines as print_ct_stderr_log shows them."""
    from ...provision import lxcmodel  # here, not at the top: every `pct` stand-in call imports this module

    StartModel, host_rdev_under = lxcmodel.StartModel, lxcmodel.host_rdev_under
    entries = [(None, k, str(v)) for k, v in conf.items() if re.match(r"^dev\d+$", k)]
    entries += [(None, "unprivileged", str(conf.get("unprivileged", 0)))]
    entries += [(None, k, v) for k, v in conf.get("lxc", [])]
    model = StartModel.build(
        entries, host_rdev_under(str(sim.hpath("/"))), lxcmodel.host_exists_under(str(sim.hpath("/")))
    )
    for e in model.errors:
        if e.startswith("Could not mknod"):
            raise StandinError(
                f"{e}\nERROR    conf - ../src/lxc/conf.c:run_buffer:322 - "
                "Script exited with status 255"
                f"\nstartup for container '{vmid}' failed",
                _TASK_FAIL,
            )
        if "bpf program" in e or "lxc.include" in e:
            raise StandinError(
                f"ERROR    cgfsng - ../src/lxc/cgroups/cgfsng.c:cgfsng_devices_activate - {e}"
                f"\nstartup for container '{vmid}' failed",
                _TASK_FAIL,
            )
    return model.allow_strings()


def _real_start(sim: SimBox, vmid: int, conf: dict) -> dict | None:
    """Where real LXC runs here (gpubox.simbox.lxcreal.detect), the same config is started as a real
    container over the simulated host's nodes: a start the kernel or LXC refuses fails here with its
    own lines; otherwise its verdict per node is kept. None where only the simulation runs."""
    from .. import lxcreal

    rt = lxcreal.runtime()
    if not rt.real:
        return None
    ans = lxcreal.run([lxcreal.Spec(render_config(conf), str(sim.hpath("/")))], rt)[0]
    if not ans["starts"]:
        raise StandinError(
            "\n".join(ans["error"]) + f"\nstartup for container '{vmid}' failed (real LXC: {rt.name})",
            _TASK_FAIL,
        )
    # the verdict with the major:minor the container saw (a node swapped later is judged anew)
    return {
        "runtime": rt.name,
        "nodes": {p: [n["verdict"], *(n["rdev"] or [])] for p, n in ans["nodes"].items()},
    }


def _lxc_start(sim: SimBox, vmid: int, conf: dict, rules: list, devs: list) -> None:
    rules[:] = _refuse_like_lxc(sim, vmid, conf)  # what the bpf program allows, as lxc builds it

    binds = []
    for k, v in conf.get("lxc", []):
        if k == "lxc.mount.entry":
            f = v.split()
            if len(f) >= 4 and "bind" in f[3].split(","):
                binds.append((f[0], f[1], "optional" in f[3].split(",")))
    _clear_dev(sim)
    for src, tgt, optional in binds:
        hp = sim.hpath(src)
        if not hp.exists():
            if optional:
                continue
            # lxc's log line as print_ct_stderr_log shows it (the "lxc-start <vmid> <time>" prefix cut)
            raise StandinError(
                f"ERROR    conf - ../src/lxc/conf.c:mount_entry:2413 - No such file or directory - "
                f'Failed to mount "{src}" on "/usr/lib/x86_64-linux-gnu/lxc/rootfs/{tgt}"\n'
                f"startup for container '{vmid}' failed",
                _TASK_FAIL,
            )
        if hp.is_dir():
            for name in sorted(os.listdir(hp)):
                _bind_node(sim, f"{src.rstrip('/')}/{name}", f"{tgt.rstrip('/')}/{name}")
        else:
            _bind_node(sim, src, tgt)
    for path, ma, mi, mode, uid, gid in devs:  # create_passthrough_device_node + autodev hook
        p = sim.cpath(path)
        mknod(p, ma, mi, mode)
        os.chown(p, uid, gid)
    real = _real_start(sim, vmid, conf)  # after the simulated /dev is made: the kernel has the last word
    return {"runtime": real["runtime"] if real else "simulation", "real_nodes": real["nodes"] if real else {}}


SNIPPET_STORAGES = {"local": "/var/lib/vz"}  # Proxmox's built-in dir storage (pve-storage)


def hookscript_path(sim: SimBox, volid: str) -> str:
    """GuestHelpers check_hookscript: a `<storage>:snippets/<file>` volume that exists and is executable."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9_.-]*):snippets/([^/]+)$", volid)
    base = SNIPPET_STORAGES.get(m.group(1)) if m else None
    if base is None:
        raise StandinError(
            f"400 Parameter verification failed.\nhookscript: unable to parse volume ID '{volid}'", _TASK_FAIL
        )
    path = f"{base}/snippets/{m.group(2)}"
    if not sim.hpath(path).is_file():
        raise StandinError(
            f"400 Parameter verification failed.\nhookscript: script '{volid}' does not exist", _TASK_FAIL
        )
    if not os.access(sim.hpath(path), os.X_OK):
        raise StandinError(
            f"400 Parameter verification failed.\nhookscript: script '{volid}' is not executable", _TASK_FAIL
        )
    return path


def _write_lxc_config(sim: SimBox, vmid: int, conf: dict, rules: list) -> None:
    """update_lxc_config: /var/lib/lxc/<vmid>/config, what lxc-start reads (raw lxc.* keys and the
    devN rules, as `key = value`)."""
    lines = [f"lxc.arch = {conf.get('arch', 'amd64')}", f"lxc.uts.name = {conf.get('hostname', f'CT{vmid}')}"]
    lines += [f"lxc.cgroup2.devices.allow = {r}" for r in rules]
    lines += [f"{k} = {v}" for k, v in conf.get("lxc", [])]
    p = sim.hpath(f"/var/lib/lxc/{vmid}/config")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(lines) + "\n")


def _hook(sim: SimBox, vmid: int, conf: dict, phase: str) -> None:
    """GuestHelpers exec_hookscript: `<script> <vmid> <phase>`; its output goes to the task log."""
    volid = conf.get("hookscript")
    if not volid:
        return
    try:
        path = hookscript_path(sim, str(volid))
        argv = [str(sim.hpath(path)), str(vmid), phase]
        env = dict(os.environ, GPUBOX_SIM_SIDE="host")
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL)
        rc = p.returncode
        err = "" if rc == 0 else f"script run failed: '{path} {vmid} {phase}' failed: exit code {rc}"
    except StandinError as exc:
        err = str(exc).splitlines()[-1]
    except OSError as exc:
        err = f"script run failed: {exc.strerror}"
    if not err:
        return
    msg = f"hookscript error for {vmid} on {phase}: {err}"
    if phase == "pre-start":
        raise StandinError(msg, _TASK_FAIL)
    print(f"WARN: {msg}")
    sys.stdout.flush()


def _start_with_hooks(sim: SimBox, vmid: int, conf: dict, rules: list, devs: list, record_boot: bool) -> None:
    _write_lxc_config(sim, vmid, conf, rules)
    sys.stdout.flush()
    _hook(sim, vmid, conf, "pre-start")
    with sim.state() as st:
        ct = _ct(st, vmid)
        started = _lxc_start(sim, vmid, conf, rules, devs)
        ct.update(status="running", cgroup_allow=rules, start_rules=len(rules), **started)
        if record_boot:
            ct["boots"] = ct.get("boots", 0) + 1
    from . import systemctl

    systemctl.boot_units(sim, "container")  # the container's init starts its enabled units
    _hook(sim, vmid, conf, "post-start")


def set_options(sim: SimBox, vmid: int, rest: list[str], warn: Warn) -> None:
    """pct set: only --hookscript VOLID and --delete hookscript are simulated (write_config re-renders).
    hookscript is one of LXC/Config.pm's $LXC_FASTPLUG_OPTIONS: set at once on a running CT too."""
    opts, _ = _opts(rest, ("hookscript", "delete"))
    conf = load_config(sim, vmid, warn)
    _check_lock(conf)
    if "hookscript" in opts:
        hookscript_path(sim, opts["hookscript"])
        conf["hookscript"] = opts["hookscript"]
    for k in re.split(r"[,;\s]+", opts.get("delete", "")):
        if k:
            conf.pop(k, None)
    write_config(sim, vmid, conf)


@contextmanager
def lock_config(sim: SimBox, vmid: int, timeout: float = 10):
    """AbstractConfig lock_config -> pve-common Tools.pm lock_file_full: flock(LOCK_EX) on
    /run/lock/lxc/pve-config-<vmid>.lock, 10 s, then "can't lock file ... - got timeout". The start
    worker holds it through vm_start, the hookscript's phases included (Status.pm vm_start)."""
    path = sim.hpath(f"/run/lock/lxc/pve-config-{vmid}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StandinError(
                        f"can't lock file '/run/lock/lxc/pve-config-{vmid}.lock' - got timeout", _TASK_FAIL
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def start(
    sim: SimBox, vmid: int, record_boot: bool = True, ignore_lock: bool = False, warn: Warn | None = None
) -> None:
    """Status.pm vm_start: 'already running' before the worker; lock, pending, devN inside it."""
    if is_running(sim, vmid):
        raise PreTaskError(f"CT {vmid} already running")
    with lock_config(sim, vmid):
        conf = load_config(sim, vmid, warn)
        if not ignore_lock:
            _check_lock(conf)
        rules, devs = _vm_start(sim, vmid, conf)
        _start_with_hooks(sim, vmid, conf, rules, devs, record_boot)


def _do_stop(sim: SimBox, vmid: int) -> None:
    with sim.state() as st:
        _ct(st, vmid).update(status="stopped", cgroup_allow=[])
    _clear_dev(sim)


def stop(sim: SimBox, vmid: int, warn: Warn | None = None) -> None:
    """Status.pm vm_stop / vm_shutdown: 'CT <vmid> not running' before the worker; lock inside."""
    if not is_running(sim, vmid):
        raise PreTaskError(f"CT {vmid} not running")
    _check_lock(load_config(sim, vmid, warn))
    _do_stop(sim, vmid)


def reboot(sim: SimBox, vmid: int, warn: Warn | None = None) -> None:
    """Status.pm vm_reboot ('VM <vmid> not running', sic) -> LXC.pm vm_reboot: stop, then vm_start.
    No lock check of its own: the prestart hook refuses a locked CT after it was stopped."""
    if not is_running(sim, vmid):
        raise PreTaskError(f"VM {vmid} not running")
    _do_stop(sim, vmid)
    with lock_config(sim, vmid):
        conf = load_config(sim, vmid, warn)
        rules, devs = _vm_start(sim, vmid, conf, hook_checks_lock=True)
        _start_with_hooks(sim, vmid, conf, rules, devs, True)


def status_current(sim: SimBox, vmid: int) -> dict:
    """LXC.pm vmstatus for one CT (the fields the API's status/current and `pct status` show)."""
    conf = current_config(load_config(sim, vmid))
    with sim.state() as st:
        running = _ct(st, vmid)["status"] == "running"
    d = {
        "vmid": int(vmid),
        "type": "lxc",
        "status": "running" if running else "stopped",
        "name": re.sub(r"\s", "", str(conf.get("hostname") or f"CT{vmid}")),
        "cpus": conf.get("cores") or 1,
        "maxmem": int(conf.get("memory") or 512) * 1024 * 1024,
        "maxswap": int(conf.get("swap") or 0) * 1024 * 1024,
        "uptime": 1234 if running else 0,
        "mem": 0,
        "swap": 0,
        "disk": 0,
        "maxdisk": 300 * 1024**3,
        "cpu": 0,
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
    }
    if running:
        d["pid"] = 4242
    if conf.get("lock"):
        d["lock"] = conf["lock"]
    return d


# -- the command line --------------------------------------------------------------------------


def _opts(rest: list[str], names: tuple[str, ...]) -> tuple[dict, list[str]]:
    """`--name value` / `-name value` / `--name=value` options (PVE's getopt), the rest positional."""
    opts, pos, it = {}, [], iter(rest)
    for a in it:
        bare = a.lstrip("-")
        key, eq, val = bare.partition("=")
        if a.startswith("-") and key in names:
            opts[key] = val if eq else next(it, "")
        elif a.startswith("-") and a != "--" and not a.lstrip("-").isdigit():
            raise StandinError(
                f"400 Parameter verification failed.\n{key}: property is not defined in schema "
                "and the schema does not allow additional properties",
                _TASK_FAIL,
            )
        else:
            pos.append(a)
    return opts, pos


def _perms(value: str | None) -> int | None:
    """push/pull: `$perms = "0$perms" if $perms !~ m/^0/` then strtoul(.., 0): octal unless 0x."""
    if value is None:
        return None
    v = value if value.startswith("0") else "0" + value
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(v, 8)
    except ValueError:
        raise StandinError(f"invalid mode: '{v}'", 0) from None


def _owner(sim: SimBox, name: str | None, db: str) -> int | None:
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    try:
        for line in sim.cpath(f"/etc/{db}").read_text().splitlines():
            f = line.split(":")
            if f[0] == name and len(f) > 2:
                return int(f[2])
    except OSError:
        pass
    raise StandinError(f"failed to get {'uid' if db == 'passwd' else 'gid'} for: {name}", 0)


def _create_file(path, perms: int | None, uid: int | None, gid: int | None, data: bytes) -> None:
    """pct.pm create_file: O_EXCL new file 0666&~umask, or O_TRUNC an existing one; chmod/chown if given."""
    existed = os.path.lexists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if existed else os.O_EXCL), 0o666)
    except OSError as exc:
        raise StandinError(f"failed to create file: {path}: {exc.strerror}", 0) from None
    with os.fdopen(fd, "wb") as f:
        if perms is not None:
            os.fchmod(f.fileno(), perms)
        if uid is not None or gid is not None:
            st = os.fstat(f.fileno())
            os.fchown(f.fileno(), st.st_uid if uid is None else uid, st.st_gid if gid is None else gid)
        f.write(data)


def _copy(sim: SimBox, vmid: int, cmd: str, rest: list[str]) -> int:
    opts, pos = _opts(rest, ("perms", "user", "group"))
    if len(pos) < 2:
        what = "<file> <destination>" if cmd == "push" else "<path> <destination>"
        raise StandinError(f"400 not enough arguments\npct {cmd} <vmid> {what} [OPTIONS]", _TASK_FAIL)
    if not is_running(sim, vmid):  # before fork_worker: dies out of pct
        if cmd == "push":
            raise PreTaskError("can only push files to a running CT")
        raise PreTaskError(f"can only pull files from a running VM at {PCT_PM} line 664.")
    src, dst = pos[0], pos[1]
    try:  # the worker: its errors are printed, but push/pull have no $upid_exit -> exit 0
        perms = _perms(opts.get("perms"))
        if cmd == "push":
            try:
                data = open(src, "rb").read()
            except OSError:
                raise StandinError(f"failed to open {src} for reading", 0) from None
            _create_file(
                sim.cpath(dst),
                perms,
                _owner(sim, opts.get("user"), "passwd"),
                _owner(sim, opts.get("group"), "group"),
                data,
            )
        else:
            uid = int(opts["user"]) if opts.get("user", "").isdigit() else None
            gid = int(opts["group"]) if opts.get("group", "").isdigit() else None
            try:
                data = open(sim.cpath(src), "rb").read()
            except OSError as exc:
                _create_file(dst, perms, uid, gid, b"")
                raise StandinError(f"failed to open {src}: {exc.strerror}", 0) from None
            _create_file(dst, perms, uid, gid, data)
    except StandinError as exc:
        sys.stderr.write(f"{exc}\n")
    return 0


def _print_config(sim: SimBox, vmid: int, rest: list[str], warn: Warn) -> None:
    """pct.pm `config` output: sorted `key: value` (description encoded), then the lxc pairs."""
    opts, _ = _opts(rest, ("current", "snapshot"))
    conf = load_config(sim, vmid, warn)
    if opts.get("snapshot"):
        snap = conf["snapshots"].get(opts["snapshot"])
        if snap is None:
            raise StandinError(f"snapshot '{opts['snapshot']}' does not exist", _TASK_FAIL)
        conf = snap
    elif opts.get("current", "0") not in ("", "0"):
        conf = {k: v for k, v in conf.items() if k not in ("pending", "snapshots")}
    else:
        conf = current_config(conf)
    for k in sorted(conf):
        if k in ("digest", "lxc", "pending", "snapshots"):
            continue
        v = _encode_text(conf[k]) if k == "description" else conf[k]
        print(f"{k}: {v}")
    for k, v in conf.get("lxc", []):
        print(f"{k}: {v}")


def main(sim: SimBox, argv: list[str]) -> int:
    if not argv:
        raise StandinError("ERROR: no command specified\nUSAGE: pct <COMMAND> [ARGS] [OPTIONS]", _TASK_FAIL)
    if len(argv) < 2:
        raise StandinError(f"400 not enough arguments\npct {argv[0]} <vmid> [OPTIONS]", _TASK_FAIL)
    cmd, vmid_s, rest = argv[0], argv[1], argv[2:]
    if not vmid_s.isdigit():
        raise StandinError(
            f"400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{vmid_s}'\n"
            f"pct {cmd} <vmid> [OPTIONS]",
            _TASK_FAIL,
        )
    vmid = int(vmid_s)

    def to_stderr(m: str) -> None:
        sys.stderr.write(m + "\n")

    def to_stdout(m: str) -> None:  # inside a worker, STDERR is the task log, which tee prints on STDOUT
        print(m)

    if cmd == "status":
        opts, _ = _opts(rest, ("verbose",))
        load_config(sim, vmid, to_stderr)  # "test if CT exists"
        d = status_current(sim, vmid)
        if opts.get("verbose", "0") not in ("", "0"):
            for k in sorted(d):
                if k != "cpu":
                    print(f"{k}: {d[k]}")
        else:
            print(f"status: {d['status']}")
        return 0
    if cmd in ("start", "stop", "shutdown", "reboot"):
        fn = {"start": start, "stop": stop, "shutdown": stop, "reboot": reboot}[cmd]
        try:
            fn(sim, vmid, warn=to_stdout)
        except PreTaskError:
            raise
        except StandinError as exc:
            # Lines before the last are the worker's own output (print_ct_stderr_log writes to the
            # task log, which tee_worker copies to stdout); the task error goes to stderr, its
            # newlines made spaces (fork_worker), and $upid_exit exits -1.
            *log, last = str(exc).split("\n")
            for line in log:
                print(line)
            sys.stderr.write(last + "\n")
            return _TASK_FAIL
        return 0
    if cmd == "set":
        set_options(sim, vmid, rest, to_stderr)
        return 0
    if cmd == "config":
        _print_config(sim, vmid, rest, to_stderr)
        return 0
    if cmd == "unlock":  # pct.pm unlock: remove the lock key, write_config (the whole file re-rendered)
        conf = load_config(sim, vmid, to_stderr)
        conf.pop("lock", None)
        write_config(sim, vmid, conf)
        return 0
    if cmd == "exec":
        load_config(sim, vmid, to_stderr)  # "test if container exists on this node"
        if not is_running(sim, vmid):
            raise StandinError(f"container '{vmid}' not running!", _TASK_FAIL)
        if rest[:1] == ["--"]:
            rest = rest[1:]
        if not rest:
            raise StandinError(f"missing command at {PCT_PM} line 246.", _TASK_FAIL)
        env = dict(os.environ, GPUBOX_SIM_SIDE="container")
        return subprocess.run(rest, env=env, stdin=sys.stdin).returncode  # exec lxc-attach: its status
    if cmd in ("push", "pull"):
        return _copy(sim, vmid, cmd, rest)
    raise StandinError(
        f"ERROR: unknown command 'pct {cmd}'\nUSAGE: pct <COMMAND> [ARGS] [OPTIONS]", _TASK_FAIL
    )
