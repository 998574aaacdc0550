"""A `pct` whose containers are real LXC containers (gpubox.simbox.lxcreal), for a host that has LXC
but no Proxmox: the real-GPU run and the demo on such a machine.

The config is `<root>/etc/pve/lxc/<vmid>.conf` (a host root prefix, as gpubox's `gpubox_root`).
What differs from Proxmox, on purpose: a "running" container is a recorded start (the config as it
was at `pct start`, checked by a real start); every `pct exec` runs its command as the init of a new
real container built from that recorded config, with a read-only rbind of the host's `/` as rootfs
and the host's own device nodes (so a config change takes effect only at the next start, as on
Proxmox). Subcommands: status, start, stop, shutdown, reboot, exec, config. Exit statuses and
messages follow pve-container's pct (see gpubox/simbox/cmds/pct.py): 255 for a failed task.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from . import lxcreal

_FAIL = 255


def _state_file(root: Path, vmid: str) -> Path:
    return root / "run" / "gpubox-lxcpct" / f"{vmid}.json"


def _conf(root: Path, vmid: str) -> str:
    p = root / "etc/pve/lxc" / f"{vmid}.conf"
    if not p.exists():
        raise SystemExit(_die(f"Configuration file 'nodes/localhost/lxc/{vmid}.conf' does not exist"))
    return p.read_text()


def _die(msg: str) -> int:
    print(msg, file=sys.stderr)
    return _FAIL


def _state(root: Path, vmid: str) -> dict:
    p = _state_file(root, vmid)
    return json.loads(p.read_text()) if p.exists() else {"status": "stopped"}


def _save(root: Path, vmid: str, st: dict) -> None:
    p = _state_file(root, vmid)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(st))
    os.replace(tmp, p)


def _start(root: Path, vmid: str) -> int:
    text = _conf(root, vmid)
    ans = lxcreal.run([lxcreal.Spec(text, "/", rootfs="/")])[0]
    if not ans["starts"]:
        for line in ans["error"]:
            print(line, file=sys.stderr)
        return _die(f"startup for container '{vmid}' failed")
    _save(root, vmid, {"status": "running", "config": text, "runtime": ans["runtime"]})
    return 0


def _exec(root: Path, vmid: str, argv: list[str]) -> int:
    st = _state(root, vmid)
    if st["status"] != "running":
        return _die(f"CT {vmid} not running")
    if not argv:
        return _die("missing command")
    exe = argv[0] if argv[0].startswith("/") else shutil.which(argv[0])
    if not exe:
        print(f"lxc-attach: {vmid}: failed to exec '{argv[0]}': No such file or directory", file=sys.stderr)
        return 127
    env = [f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}"]
    if os.environ.get("LD_LIBRARY_PATH"):
        env.append(f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
    # lxc.init.cmd is split at blanks and lxc-start -F exits 0 whatever init returns: the command
    # goes into a script (quoted) that a shell runs as init, printing the command's status last
    import shlex
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpubox-lxcpct-") as d:
        os.chmod(d, 0o755)
        script = Path(d) / "run.sh"
        cmd = " ".join(shlex.quote(a) for a in ["/usr/bin/env", *env, exe, *argv[1:]])
        script.write_text(f'#!/bin/sh\n{cmd}\necho "GPUBOXRC $?"\n')
        spec = lxcreal.Spec(st["config"], "/", probe=["/dev/null"], rootfs="/")
        spec.exec_after = ["/bin/sh", str(script)]
        ans = lxcreal.run([spec])[0]
    if not ans["starts"]:
        for line in ans["error"]:
            print(line, file=sys.stderr)
        return _die(f"CT {vmid}: the container did not start")
    out, rc = [], 1
    for line in ans["output"]:
        if line.startswith("GPUBOXRC "):
            rc = int(line.split()[1])
        else:
            out.append(line)
    if out:
        print("\n".join(out))
    sys.stderr.write(ans.get("stderr", ""))
    return rc


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--root":
        print("usage: python -m gpubox.simbox.lxcpct --root ROOT pct CMD VMID [-- ARGV]", file=sys.stderr)
        return 2
    root, args = Path(argv[1]), argv[3:]
    cmd, vmid, rest = args[0], args[1] if len(args) > 1 else "", args[2:]
    if cmd == "status":
        _conf(root, vmid)
        print(f"status: {_state(root, vmid)['status']}")
        return 0
    if cmd == "config":
        sys.stdout.write(_conf(root, vmid))
        return 0
    if cmd == "start":
        if _state(root, vmid)["status"] == "running":
            return _die(f"CT {vmid} already running")
        return _start(root, vmid)
    if cmd in ("stop", "shutdown"):
        if _state(root, vmid)["status"] != "running":
            return _die(f"CT {vmid} not running")
        _save(root, vmid, {"status": "stopped"})
        return 0
    if cmd == "reboot":
        if _state(root, vmid)["status"] != "running":
            return _die(f"VM {vmid} not running")
        _save(root, vmid, {"status": "stopped"})
        return _start(root, vmid)
    if cmd == "exec":
        if rest[:1] == ["--"]:
            rest = rest[1:]
        return _exec(root, vmid, rest)
    return _die(f"pct {cmd}: not supported by this real-LXC pct")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
