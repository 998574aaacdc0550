"""systemctl stand-in: units are the files gpubox wrote; enable/start state lives in sim.json.

Which root a call acts on: the container's when run with GPUBOX_SIM_ROOT=ct (set by `pct exec`
in the simulation, or by the container's inventory env), else the host's.
"""

from __future__ import annotations

import os
import re
import time

from ..core import SimBox, StandinError


def _next_elapse(unit, st) -> str:
    """NextElapseUSecRealtime of a monotonic timer as systemd prints it with --value: activation
    + OnActiveSec (no run has happened in the simulation), in local time; "" when inactive or the
    timer has no monotonic setting (OnCalendar is not simulated)."""
    if not st.get("active") or not unit.exists():
        return ""
    m = re.search(r"^OnActiveSec=(\d+)(min|h|d|s)?$", unit.read_text(), re.M)
    if not m:
        return ""
    span = int(m.group(1)) * {"s": 1, None: 1, "min": 60, "h": 3600, "d": 86400}[m.group(2)]
    return time.strftime(
        "%a %Y-%m-%d %H:%M:%S %Z", time.localtime(st.get("activated_at", time.time()) + span)
    )


def conditions_met(root, unit: str) -> bool:
    """ConditionPathExists= of the unit and its drop-ins (<unit>.d/*.conf), as systemd.unit(5): a
    start whose condition fails leaves the unit inactive and is no error."""
    d = root / "etc/systemd/system"
    texts = [(d / unit).read_text()] if (d / unit).is_file() else []
    drop = d / f"{unit}.d"
    if drop.is_dir():
        texts += [f.read_text() for f in sorted(drop.glob("*.conf"))]
    for text in texts:
        for m in re.finditer(r"^ConditionPathExists=(!?)(/\S*)$", text, re.M):
            there = (root / m.group(2).lstrip("/")).exists()
            if there == bool(m.group(1)):
                return False
    return True


def boot_units(sim: SimBox, side: str) -> list[str]:
    """What init does at boot: every enabled unit of that side started (conditions honoured).
    Returns the units started."""
    root = sim.ct_root if side == "container" else sim.host_root
    out = []
    with sim.state() as st:
        for u, s in st.setdefault("units", {}).setdefault(side, {}).items():
            if s.get("enabled") and conditions_met(root, u):
                s["active"], s["starts"], s["activated_at"] = True, s.get("starts", 0) + 1, time.time()
                out.append(u)
    return out


def _root(sim: SimBox):
    return sim.ct_root if os.environ.get("GPUBOX_SIM_SIDE") == "container" else sim.host_root


def main(sim: SimBox, argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("-")]
    flags = [a for a in argv if a.startswith("-")]
    if not args:
        raise StandinError("systemctl: this simulation needs a verb", 1)
    verb, units = args[0], args[1:]
    side = "container" if _root(sim) == sim.ct_root else "host"
    unit_dir = _root(sim) / "etc/systemd/system"
    with sim.state() as st:
        units_st = st.setdefault("units", {}).setdefault(side, {})
        if verb == "daemon-reload":
            st.setdefault("daemon_reloads", {}).setdefault(side, 0)
            st["daemon_reloads"][side] += 1
            return 0
        for u in units:
            known = (unit_dir / u).exists()
            if verb in ("enable", "start", "restart", "reenable") and not known:
                raise StandinError(
                    f"Failed to {verb} unit: Unit file {u} does not exist.", 1 if verb != "enable" else 1
                )
            s = units_st.setdefault(u, {"enabled": False, "active": False, "starts": 0})
            if verb in ("enable", "reenable"):
                s["enabled"] = True
                if "--now" in flags:
                    s["active"], s["starts"] = True, s["starts"] + 1
                    s["activated_at"] = time.time()
            elif verb in ("start", "restart"):
                if not conditions_met(_root(sim), u):
                    s["condition_failed"] = s.get("condition_failed", 0) + 1
                    continue
                s["active"], s["starts"] = True, s["starts"] + 1
                s["activated_at"] = time.time()
            elif verb == "show":
                print(_next_elapse(unit_dir / u, s) if "--property=NextElapseUSecRealtime" in flags else "")
                return 0
            elif verb == "disable":
                s["enabled"] = False
                if "--now" in flags:
                    s["active"] = False
            elif verb == "stop":
                s["active"] = False
            elif verb == "is-enabled":
                print("enabled" if s["enabled"] else "disabled")
                return 0 if s["enabled"] else 1
            elif verb == "is-active":
                # a oneshot service whose last run exited non-zero is "failed" (exit 3), as systemd says
                state = "active" if s["active"] else "failed" if s.get("failed") else "inactive"
                print(state)
                return 0 if s["active"] else 3
            else:
                raise StandinError(f"systemctl: verb {verb!r} is not simulated", 1)
    return 0
