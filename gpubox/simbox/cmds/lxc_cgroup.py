"""`lxc-cgroup -n VMID devices.allow "c M:m rw"` stand-in: adds a rule to the running container's
simulated live device cgroup (on cgroup v2 LXC turns it into a BPF device rule)."""

from __future__ import annotations

from ..core import SimBox, StandinError


def main(sim: SimBox, argv: list[str]) -> int:
    args = list(argv)
    name = None
    if "-n" in args:
        i = args.index("-n")
        name = args[i + 1] if i + 1 < len(args) else None
        del args[i:i + 2]
    if not name or not args:
        raise StandinError("lxc-cgroup: missing container name, use --name option", 1)
    key, value = args[0], (args[1] if len(args) > 1 else None)
    with sim.state() as st:
        ct = st["containers"].get(name)
        if ct is None or ct["status"] != "running":
            raise StandinError(f"lxc-cgroup: {name}: tools/lxc_cgroup.c: main: 108 '{name}' is not running", 1)
        if value is None:
            if key == "devices.list":
                print("\n".join(ct["cgroup_allow"]))
                return 0
            raise StandinError(f"lxc-cgroup: {name}: tools/lxc_cgroup.c: main: 140 Failed to retrieve value of '{key}' for '{name}'", 1)
        if key != "devices.allow":
            raise StandinError(f"lxc-cgroup: {name}: tools/lxc_cgroup.c: main: 130 Failed to assign '{value}' value to '{key}' for '{name}'", 1)
        if value not in ct["cgroup_allow"]:
            ct["cgroup_allow"].append(value)
    return 0
