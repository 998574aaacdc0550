"""`lxc-cgroup -n VMID devices.allow "c M:m rw"` stand-in: adds a rule to the running container's
simulated live device cgroup (on cgroup v2 LXC turns it into a BPF device rule).

Messages follow lxc/lxc e7b855a src/lxc/tools/lxc_cgroup.c (lxc_cgroup_main) as printed by
log_append_stderr (src/lxc/log.c: "<prog>: <name>: <file>: <func>: <line> <msg>") and
lxc_error (src/lxc/tools/arguments.h: "<prog>: <msg>"); every failure exits 1 (EXIT_FAILURE).
A Proxmox VE host runs pure cgroup v2, where there is no devices.list file to read back: reading
it fails like any unknown state object.
"""

from __future__ import annotations

from ..core import SimBox, StandinError

_SRC = "../src/lxc/tools/lxc_cgroup.c"
LXCPATH = "/var/lib/lxc"


def main(sim: SimBox, argv: list[str]) -> int:
    args = list(argv)
    name = None
    for i, a in enumerate(args):
        if a in ("-n", "--name") and i + 1 < len(args):
            name = args[i + 1]
            del args[i : i + 2]
            break
        if a.startswith("--name="):
            name = a.split("=", 1)[1]
            del args[i]
            break
    if not name:
        raise StandinError("lxc-cgroup: No container name specified", 1)
    if not args:
        raise StandinError(f"lxc-cgroup: {name}: {_SRC}: my_checker: 46 Missing state object", 1)
    key, value = args[0], (args[1] if len(args) > 1 else None)
    with sim.state() as st:
        ct = st["containers"].get(name)
        if ct is None or ct["status"] != "running":
            raise StandinError(
                f"lxc-cgroup: {name}: {_SRC}: lxc_cgroup_main: 103 '{LXCPATH}:{name}' is not running", 1
            )
        if value is None:
            raise StandinError(
                f"lxc-cgroup: {name}: {_SRC}: lxc_cgroup_main: 123 Failed to retrieve value of "
                f"'{key}' for '{LXCPATH}:{name}'",
                1,
            )
        if key != "devices.allow":
            raise StandinError(
                f"lxc-cgroup: {name}: {_SRC}: lxc_cgroup_main: 112 Failed to assign '{value}' value "
                f"to '{key}' for '{name}'",
                1,
            )
        if value not in ct["cgroup_allow"]:
            ct["cgroup_allow"].append(value)
    return 0
