"""One schema for the inventory variables gpubox reads, checked when the inventory is loaded.

An inventory is user input: `gpubox_vmid: 200.7` must not act on CT 200 and `-5` must not reach
`pct status -5`. Every rule names the host and the variable in its one-line error. Variables
gpubox does not know are left to Ansible. Ranges: Proxmox accepts vmids 100..999999999
(pve-guest-common's `pve-vmid` format), TCP ports 1..65535; a GPU power limit is watts above 0.
"""

from __future__ import annotations

import posixpath
from typing import Any, Callable

from .errors import InventoryError

Rule = Callable[[Any], str | None]  # None when fine, else what is wrong (after "is ...")


def _int_in(lo: int, hi: int) -> Rule:
    def rule(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            return f"a {type(v).__name__}, not a whole number {lo}..{hi}"
        if isinstance(v, str):
            text = v.strip()
            if not text.isascii() or not text.isdigit():
                return f"not a whole number {lo}..{hi}"
            if len(text) > 1 and text.startswith("0"):
                # "0200" from -e or a quoted value: Ansible templates it as written (0200.conf)
                return f"not a plain decimal number (leading zero); write {int(text)}"
            v = int(text)
        return None if lo <= v <= hi else f"outside {lo}..{hi}"

    return rule


def _number_pos(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
        return "not a positive number of seconds"
    return None


MAX_WATTS = 5000  # no single GPU's power limit comes near it (B200: 1000 W); more is a typo


def _watts(v: Any) -> str | None:
    """A GPU power limit in watts, as nvidia-smi -pl takes it: a positive finite number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not 0 < v <= MAX_WATTS:
        return f"not a power limit in watts (a number above 0, at most {MAX_WATTS})"
    return None


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "not a non-empty string"


def _abs_path(v: Any) -> str | None:
    """An absolute path in one spelling: `//`, `/./` and `..` components are refused with the
    canonical form to write, so every gate after this one judges the same path the kernel
    opens (a trailing `/` is allowed: it names the same directory)."""
    if not isinstance(v, str) or not v.startswith("/"):
        return "not an absolute path"
    if "\0" in v:
        return "a path with a NUL byte"
    canon = "/" + posixpath.normpath(v).lstrip("/")
    if v.rstrip("/") != canon.rstrip("/") and v != "/":
        return f"not a canonical path (`//`, `.` or `..`); write {canon}"
    return None


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "not true/false"


def _mapping(v: Any) -> str | None:
    return None if isinstance(v, dict) else f"a {type(v).__name__}, not a mapping"


def _str_map(v: Any) -> str | None:
    if not isinstance(v, dict):
        return f"a {type(v).__name__}, not a mapping of NAME: value"
    bad = [k for k, x in v.items() if not isinstance(x, (str, int, float, bool)) or isinstance(x, bool)]
    return f"a mapping whose {bad[0]!r} is not a string/number" if bad else None


def _str_list(v: Any) -> str | None:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        return "not a list of non-empty strings"
    return None


def _argv(v: Any) -> str | None:
    return None if isinstance(v, str) and v or _str_list(v) is None else "not a command (string or list)"


SCHEMA: dict[str, Rule] = {
    "gpubox_vmid": _int_in(100, 999_999_999),
    "gpubox_gpus": _int_in(0, 1024),
    "gpubox_numa_balancing": _int_in(0, 2),
    "ansible_port": _int_in(1, 65535),
    "ansible_ssh_port": _int_in(1, 65535),
    "gpubox_ct_timeout": _number_pos,
    "gpubox_alert_timeout": _number_pos,
    "gpubox_expected_power_limit": _watts,
    "gpubox_root": _abs_path,
    "gpubox_proxmox_host": _str,
    "gpubox_nccl_profile": _str,
    "gpubox_connection": _str,
    "gpubox_device_mode": _str,
    "ansible_host": _str,
    "gpubox_simulated": _bool,
    "gpubox_bench": _mapping,
    "gpubox_model": _mapping,
    "gpubox_drafter": _mapping,
    "gpubox_api": _mapping,
    "gpubox_schedule": _mapping,
    "gpubox_probe": _mapping,
    "gpubox_numa_nodes": _mapping,
    "gpubox_env": _str_map,
    "gpubox_bin_dirs": _str_list,
    "gpubox_alert_command": _argv,
}


def check_host(name: str, vars: dict[str, Any]) -> None:
    """Raise InventoryError naming NAME and the first variable that breaks the schema."""
    for key, rule in SCHEMA.items():
        if key not in vars:
            continue
        problem = rule(vars[key])
        if problem:
            raise InventoryError(
                f"{name}: {key} = {_show(vars[key])} is {problem}", f"fix {key} in the inventory"
            )
    if vars.get("gpubox_simulated") is True and str(vars.get("gpubox_root") or "/") == "/":
        raise InventoryError(
            f"{name}: gpubox_simulated is true but gpubox_root is missing",
            "set gpubox_root to the simulated box's root; gpubox will not touch this machine's /",
        )


def check_box(name: str, ct_vars: dict[str, Any], host_name: str | None, host_vars: dict[str, Any]) -> int:
    """The one gate for a box, whatever the front end (CLI, Ansible module, playbook extra-vars,
    schedule run-once, the container side): both hosts' variables against SCHEMA, then what a box
    must have. Returns the vmid as an int; raises InventoryError naming the variable."""
    check_host(name, ct_vars)
    if "gpubox_vmid" not in ct_vars or ct_vars["gpubox_vmid"] in (None, ""):
        raise InventoryError(
            f"{name}: gpubox_vmid is missing", "set gpubox_vmid to the container's numeric id, e.g. 200"
        )
    if not host_name:
        raise InventoryError(
            f"{name}: gpubox_proxmox_host is missing",
            "set gpubox_proxmox_host to the inventory name of its Proxmox host",
        )
    check_host(str(host_name), host_vars)
    return int(str(ct_vars["gpubox_vmid"]).strip())


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
